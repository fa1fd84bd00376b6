"""RFM segment snapshot time on PostgreSQL for one large organization.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/crm_segments REDIS_URL=redis://127.0.0.1:6379/15 \\
    SECRET_KEY=... ENCRYPTION_KEY=... .venv/bin/python benchmarks/segments_snapshot.py \\
        [--customers 200000] [--sales-per-customer 3] [--explain]

Uses (and creates and migrates if missing) the database in DATABASE_URL and keeps a
`bench-segments-N` organization between runs (customers without any sale included, sales over two
years). Prints the seconds of: a first snapshot, the same day again (rows replaced), the next day
(with the movement), pruning, and a campaign audience over the newest snapshot; the rows, the
queries each took, and this process's peak memory (the work is in SQL, so it stays flat).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django  # noqa: E402

django.setup()

from django.db import connection, transaction  # noqa: E402
from django.db.models import CharField, Value  # noqa: E402
from django.db.models.functions import Cast, Concat, LPad  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from benchmarks.common import ensure_database  # noqa: E402
from campaigns import segments, selectors  # noqa: E402
from campaigns.models import Campaign  # noqa: E402
from crm.models import Customer, Organization, Sale, Store  # noqa: E402

DAY = date(2026, 11, 29)
CHUNK = 20_000


def ensure_world(customers: int, per_customer: int) -> Organization:
    org, _ = Organization.objects.get_or_create(
        slug=f"bench-segments-{customers}", defaults={"name": f"Segments {customers}"}
    )
    store, _ = Store.objects.get_or_create(organization=org, erp_code="B1", defaults={"name": "Bench"})
    have = Customer.objects.filter(organization=org).count()
    if have >= customers:
        # Reachable on WhatsApp, so the audience timing below selects real rows.
        Customer.objects.filter(organization=org, phone="").update(
            phone=Concat(Value("+5511"), LPad(Cast("id", CharField()), 9, Value("0")))
        )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE crm_customer")
        return org
    rng = random.Random(customers)
    end = datetime.combine(DAY, datetime.min.time(), tzinfo=UTC)
    started = time.monotonic()
    for start in range(have, customers, CHUNK):
        people = Customer.objects.bulk_create(
            [
                Customer(organization=org, erp_id=f"SB{i}", name=f"Cliente{i}")
                for i in range(start, min(start + CHUNK, customers))
            ]
        )
        sales = []
        for c in people:
            # 0 to 2 x per_customer sales (about per_customer on average), over two years.
            for k in range(rng.randint(0, 2 * per_customer)):
                sales.append(
                    Sale(
                        organization=org,
                        store=store,
                        customer=c,
                        erp_id=f"SB{c.pk}-{k}",
                        total=Decimal(rng.randint(1000, 200_000)) / 100,
                        sold_at=end - timedelta(seconds=rng.randint(0, 730 * 86400)),
                    )
                )
        Sale.objects.bulk_create(sales, batch_size=5000)
        print(f"  world: {start + len(people):,} customers ({time.monotonic() - started:.0f}s)", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE crm_sale")
        cursor.execute("ANALYZE crm_customer")
    return org


def timed(label: str, fn):
    with CaptureQueriesContext(connection) as queries:
        started = time.monotonic()
        result = fn()
        seconds = time.monotonic() - started
    print(f"{label:<38} {seconds:7.2f}s  {len(queries):3d} queries")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--customers", type=int, default=200_000)
    parser.add_argument("--sales-per-customer", type=int, default=3)
    parser.add_argument("--explain", action="store_true", help="print the snapshot's EXPLAIN ANALYZE")
    args = parser.parse_args()
    ensure_database()
    org = ensure_world(args.customers, args.sales_per_customer)
    sales = Sale.objects.filter(organization=org).count()
    print(f"organization {org.slug}: {args.customers:,} customers, {sales:,} sales")
    with connection.cursor() as cursor:  # a clean start: no earlier snapshot of this organization
        cursor.execute("DELETE FROM campaigns_customersegment WHERE organization_id = %s", [org.pk])
        cursor.execute("DELETE FROM campaigns_segmentmovement WHERE organization_id = %s", [org.pk])

    def snapshot(day: date) -> dict[str, int]:
        return segments.segments_snapshot(organization_id=org.pk, day=day)

    counts = timed(f"snapshot {DAY}", lambda: snapshot(DAY))
    print("  " + segments.snapshot_summary(org.slug, DAY, counts, 0).rsplit(" in ", 1)[0])
    timed(f"snapshot {DAY} again (replaced)", lambda: snapshot(DAY))
    nxt = DAY + timedelta(days=1)
    timed(f"snapshot {nxt} (+ movement)", lambda: snapshot(nxt))
    timed("prune (keep 35 days)", lambda: segments.segments_prune(organization_id=org.pk))
    campaign = Campaign(organization=org, channel="whatsapp", audience_segment=segments.Segment.CHAMPIONS)
    audience = selectors.campaign_audience(campaign=campaign).values_list("pk", flat=True)
    n = timed("audience 'champions' (all ids)", lambda: len(list(audience.iterator(chunk_size=5000))))
    print(f"  {n:,} customers (those with a phone, consent, not opted out)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory of this process: {peak:.0f} MB")
    if args.explain:
        from campaigns.segments import _local_midnight, _snapshot_sql

        zone = segments.ZoneInfo(org.timezone)
        day = DAY + timedelta(days=2)
        params = {
            "org": org.pk,
            "day": day,
            "tz": zone.key,
            "db_tz": "UTC",
            "cutoff": _local_midnight(day + timedelta(days=1), zone),
            "year_start": _local_midnight(day - timedelta(days=364), zone),
            "new_start": _local_midnight(day - timedelta(days=29), zone),
        }
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL work_mem = '64MB'")
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + _snapshot_sql(), params)
            print("\n".join(row[0] for row in cursor.fetchall()))
            transaction.set_rollback(True)


if __name__ == "__main__":
    main()
