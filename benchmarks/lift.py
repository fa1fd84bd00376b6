"""The lift report of one campaign with a control group over a large organization: the report's
read (from the rollup), an ERP-sized page of sales written into the rollup, and rebuilding the
campaign's rollup from scratch.

    DATABASE_URL=postgres://…/crm_lift_bench REDIS_URL=… SECRET_KEY=… ENCRYPTION_KEY=… \\
    .venv/bin/python benchmarks/lift.py [--customers 1000000] [--sales 10000000] [--control 10]

The target size is 1,000,000 customers (all of them in the campaign) over 10,000,000 sales;
`--scale 0.2` takes a fifth of both (printed). Uses (creates and migrates if missing) the database
in DATABASE_URL and keeps a `bench-lift-<customers>-<sales>` organization between runs. The
campaign's messages are sent over six hours, a `--control` share held out at random; sales are
spread over half a year around it, so the campaign's 7-day window holds about 1/26 of them.
The world is built with set-based statements (generate_series, one INSERT … SELECT each: customers,
messages, sales, and the campaign's rollup as the "sales written" hook keeps it, checked against the
hook's own statement on a page of sales); `--rebuild` also times `campaign_lift_rebuild`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django  # noqa: E402

django.setup()

from django.db import connection, transaction  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from benchmarks.common import ensure_database  # noqa: E402
from campaigns import lift  # noqa: E402
from campaigns.models import Campaign, Channel, LiftSale, WhatsappMessage  # noqa: E402
from crm import bulk  # noqa: E402
from crm.models import Customer, Organization, Sale, Store  # noqa: E402

START = datetime(2026, 5, 1, tzinfo=UTC)
DAYS = 180
SENT = START + timedelta(days=90)


def _insert(model, fields: tuple[str, ...], select: str, params: list) -> int:
    sql, defaults = bulk.insert_select(model, fields, select)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [*defaults, *params])
        return cursor.rowcount


def ensure_world(customers: int, sales: int, control: int) -> Campaign:
    """The organization and its campaign, built once per size: a second run reuses them."""
    slug = f"bench-lift-{customers}-{sales}"
    org = Organization.objects.filter(slug=slug).first()
    campaign = Campaign.objects.filter(organization=org).first() if org else None
    if campaign is not None and Sale.objects.filter(organization=org).exists():
        return campaign
    if org is not None:
        org.delete()  # an interrupted build: start again
    began = time.monotonic()
    org = Organization.objects.create(slug=slug, name=f"Lift {customers}")
    store = Store.objects.create(organization=org, erp_code="L01", name="Loja")
    _insert(
        Customer,
        ("organization_id", "erp_id", "name", "created_at", "updated_at"),
        "SELECT %s, 'LC' || g, 'Cliente ' || g, now(), now() FROM generate_series(1::bigint, %s) g",
        [org.pk, customers],
    )
    first = Customer.objects.filter(organization=org).order_by("pk").values_list("pk", flat=True)[0]
    print(f"  world: {customers:,} customers ({time.monotonic() - began:.0f}s)", flush=True)
    campaign = Campaign.objects.create(
        organization=org,
        name="Bench lift",
        channel=Channel.WHATSAPP,
        status=Campaign.Status.SENT,
        started_at=SENT,
        control_percent=control,
    )
    _insert(
        WhatsappMessage,
        ("campaign_id", "organization_id", "customer_id", "status", "token", "queued_at", "sent_at"),
        "SELECT %s, %s, %s + g, CASE WHEN random() * 100 < %s THEN 'held_out' ELSE 'sent' END, "
        "'lift-' || %s || '-' || g, %s::timestamptz, %s::timestamptz + (g %% 21600) * interval '1 second' "
        "FROM generate_series(0::bigint, %s - 1) g",
        [campaign.pk, org.pk, first, control, campaign.pk, SENT, SENT, customers],
    )
    print(f"  world: {customers:,} messages ({time.monotonic() - began:.0f}s)", flush=True)
    _insert(
        Sale,
        ("organization_id", "store_id", "customer_id", "erp_id", "total", "sold_at", "items", "created_at"),
        "SELECT %s, %s, %s + (g * 7919) %% %s, 'LS' || g, ((g * 37) %% 90000 + 990) / 100.0, "
        "%s::timestamptz + ((g * 104729) %% (%s * 86400)) * interval '1 second', '[]'::jsonb, now() "
        "FROM generate_series(1::bigint, %s) g",
        [org.pk, store.pk, first, customers, START, DAYS, sales],
    )
    print(f"  world: {sales:,} sales ({time.monotonic() - began:.0f}s)", flush=True)
    with connection.cursor() as cursor:
        for table in ("crm_customer", "crm_sale", "campaigns_whatsappmessage"):
            cursor.execute(f"ANALYZE {table}")
    # The rollup as the "sales written" hook would have kept it had these sales arrived one ERP page
    # at a time: one set-based statement (a hash join of the campaign's messages and the sales), so
    # the full size is built in minutes; main() checks pages of it against the hook's own statement.
    window = lift.window_days(organization=org, channel=Channel.WHATSAPP)
    _insert(
        LiftSale,
        ("campaign_id", "sale_id", "customer_id", "control", "total"),
        "SELECT m.campaign_id, s.id, s.customer_id, m.status = 'held_out', s.total "
        "FROM campaigns_whatsappmessage m JOIN crm_sale s ON s.customer_id = m.customer_id "
        "AND s.sold_at >= m.sent_at AND s.sold_at <= m.sent_at + make_interval(days => %s) "
        "WHERE m.campaign_id = %s AND m.sent_at IS NOT NULL AND s.organization_id = %s",
        [window, campaign.pk, org.pk],
    )
    print(f"  world: the campaign's rollup ({time.monotonic() - began:.0f}s)", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE campaigns_liftsale")
    return campaign


def timed(label: str, fn):
    with CaptureQueriesContext(connection) as queries:
        started = time.monotonic()
        result = fn()
        seconds = time.monotonic() - started
    print(f"{label:<58} {seconds:8.3f}s  {len(queries):5d} queries", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--customers", type=int, default=1_000_000)
    parser.add_argument("--sales", type=int, default=10_000_000)
    parser.add_argument("--scale", type=float, default=1.0, help="a share of both sizes (e.g. 0.2)")
    parser.add_argument("--control", type=int, default=10, help="the control group's percent")
    parser.add_argument(
        "--rebuild", action="store_true", help="also time campaign_lift_rebuild (the repair path)"
    )
    args = parser.parse_args()
    customers, sales = int(args.customers * args.scale), int(args.sales * args.scale)
    print(f"scale {args.scale}: {customers:,} customers, {sales:,} sales, control {args.control}%")
    with open("/proc/loadavg") as f:
        print(f"load average: {' '.join(f.read().split()[:3])}")
    ensure_database()
    campaign = ensure_world(customers, sales, args.control)
    if args.rebuild:
        LiftSale.objects.filter(campaign=campaign).delete()
        timed(
            "rebuild the campaign's rollup (pages of 20,000 customers)",
            lambda: lift.campaign_lift_rebuild(campaign=campaign),
        )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE campaigns_liftsale")
    rows = LiftSale.objects.filter(campaign=campaign).count()
    print(f"  rollup: {rows:,} sales in the campaign's window")
    for run in (1, 2, 3):
        report = timed(
            f"lift report (campaign_lift), run {run}", lambda: lift.campaign_lift(campaign=campaign)
        )
    assert report is not None
    print(
        f"  treatment {report['treatment']}, control {report['control']}, lift {report['buyers_rate_lift']} "
        f"{report['buyers_rate_lift_ci95']}, p {report['p_value']}"
    )
    ids = list(
        Sale.objects.filter(
            organization=campaign.organization, sold_at__gte=SENT, sold_at__lt=SENT + timedelta(days=7)
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:1000]
    )

    def page() -> int:
        with transaction.atomic():
            return lift.sales_lift(organization_id=campaign.organization_id, sale_ids=ids)

    before = LiftSale.objects.filter(sale_id__in=ids).count()
    hits = timed(f"an ERP page of {len(ids):,} sales into the rollup (again)", page)
    # The bulk-built rollup is what the hook writes: the page changed nothing and counts as many.
    assert hits == before == LiftSale.objects.filter(sale_id__in=ids).count(), (hits, before)
    print(f"  the hook's statement agrees with the rollup on that page ({hits:,} pairs)")


if __name__ == "__main__":
    main()
