"""The campaign page's audience preview (campaigns.audience) for one large organization.

    DATABASE_URL=postgres://... REDIS_URL=redis://... SECRET_KEY=... ENCRYPTION_KEY=... \\
    .venv/bin/python benchmarks/audience_preview.py [--customers 100000]

Uses (and creates and migrates if missing) the database in DATABASE_URL and keeps a
`bench-audience-N` organization between runs: N customers on WhatsApp (a tenth without consent, a
fiftieth opted out), one message each to a tenth of them an hour ago from another campaign (the
contact caps' 24-hour block). Prints the seconds of the preview (aggregates, then the caps'
statement per page of 20,000), the queries it took, the counts, and this process's peak memory.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from benchmarks.common import ensure_database  # noqa: E402
from campaigns import audience  # noqa: E402
from campaigns.models import Campaign, WhatsappMessage  # noqa: E402
from crm.models import Customer, Organization  # noqa: E402
from integrations.models import WhatsappPrice  # noqa: E402

CHUNK = 20_000


def ensure_world(customers: int) -> tuple[Organization, Campaign]:
    org, _ = Organization.objects.get_or_create(
        slug=f"bench-audience-{customers}", defaults={"name": f"Audience {customers}"}
    )
    earlier, created = Campaign.objects.get_or_create(
        organization=org,
        name="earlier",
        defaults={"status": Campaign.Status.SENT, "started_at": timezone.now()},
    )
    if created:
        hour_ago = timezone.now() - timedelta(hours=1)
        for start in range(0, customers, CHUNK):
            people = Customer.objects.bulk_create(
                [
                    Customer(
                        organization=org,
                        erp_id=f"A{i}",
                        name=f"Cliente {i}",
                        phone=f"+5511{i:09d}",
                        marketing_consent=i % 10 != 0,
                        whatsapp_opted_out_at=hour_ago if i % 50 == 1 else None,
                    )
                    for i in range(start, min(start + CHUNK, customers))
                ]
            )
            WhatsappMessage.objects.bulk_create(
                [
                    WhatsappMessage(
                        campaign=earlier,
                        organization=org,
                        customer=c,
                        status=WhatsappMessage.Status.SENT,
                        sent_at=hour_ago,
                    )
                    for c in people[3::10]
                ]
            )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE crm_customer")
    WhatsappPrice.objects.get_or_create(category="marketing", country="BR", defaults={"price": "0.0625"})
    campaign, _ = Campaign.objects.get_or_create(
        organization=org, name="preview", defaults={"template_name": "promo"}
    )
    return org, campaign


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--customers", type=int, default=100_000)
    args = parser.parse_args()
    ensure_database()
    print(f"scale: {args.customers} customers; load average {os.getloadavg()[0]:.1f}")
    _org, campaign = ensure_world(args.customers)
    for run in (1, 2):
        with CaptureQueriesContext(connection) as queries:
            started = time.monotonic()
            preview = audience.audience_preview(campaign=campaign)
            seconds = time.monotonic() - started
        print(
            f"run {run}: {seconds:.2f} s, {len(queries)} queries; receives {preview.receives}, "
            f"skipped {preview.skipped}, cost {preview.cost} {preview.currency}"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory of this process: {peak:.0f} MB")


if __name__ == "__main__":
    main()
