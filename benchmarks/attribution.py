"""Revenue attribution over one large organization: the full refresh, a second (idempotent) one,
ERP-sized incremental pages, and the reads of the campaign page and the dashboard.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/crm_h2_bench REDIS_URL=redis://127.0.0.1:6379/15 \\
    SECRET_KEY=... ENCRYPTION_KEY=... .venv/bin/python benchmarks/attribution.py \\
        [--messages 1000000] [--sales 3000000] [--customers 500000] [--campaigns 10] [--page 20000]

Uses (and creates and migrates if missing) the database in DATABASE_URL and keeps a
`bench-attribution-<sales>` organization between runs: customers, campaigns (half WhatsApp, half
email) whose messages are spread over half a year, and sales over the same half year, all written
with INSERT … SELECT generate_series. Every figure is measured in this run, next to a baseline: a
plain INSERT … SELECT of as many rows into a copy of the attribution table (same columns and
indexes, no lookup), i.e. what writing the rows alone costs here.
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
from campaigns import attribution, dashboards, selectors  # noqa: E402
from campaigns.models import Campaign, Channel, EmailMessage, SaleAttribution, WhatsappMessage  # noqa: E402
from crm import bulk  # noqa: E402
from crm.models import Customer, Organization, Sale, Store  # noqa: E402

START = datetime(2026, 5, 1, tzinfo=UTC)
DAYS = 180
STORES = 10


def _execute(sql: str, params: list | None = None) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.rowcount


def _insert(model, fields: tuple[str, ...], select: str, params: list) -> int:
    sql, defaults = bulk.insert_select(model, fields, select)
    with transaction.atomic():
        return _execute(sql, [*defaults, *params])


def ensure_world(args: argparse.Namespace) -> Organization:
    """The organization, created once per size: a second run reuses it."""
    slug = f"bench-attribution-{args.sales}"
    org, created = Organization.objects.get_or_create(
        slug=slug, defaults={"name": f"Attribution {args.sales}"}
    )
    if not created:
        if Sale.objects.filter(organization=org).exists():
            return org
        org.delete()  # an interrupted build: start again
        org = Organization.objects.create(slug=slug, name=f"Attribution {args.sales}")
    began = time.monotonic()
    stores = [
        Store.objects.get_or_create(organization=org, erp_code=f"B{i:02d}", defaults={"name": f"Loja {i}"})[0]
        for i in range(STORES)
    ]
    _insert(
        Customer,
        ("organization_id", "erp_id", "name", "created_at", "updated_at"),
        "SELECT %s, 'BA' || g, 'Cliente ' || g, now(), now() FROM generate_series(1::bigint, %s) g",
        [org.pk, args.customers],
    )
    first_customer = Customer.objects.filter(organization=org).order_by("pk").values_list("pk", flat=True)[0]
    print(f"  world: {args.customers:,} customers ({time.monotonic() - began:.0f}s)", flush=True)
    per_campaign = args.messages // args.campaigns
    for k in range(args.campaigns):
        channel = Channel.EMAIL if k % 2 else Channel.WHATSAPP
        sent = START + timedelta(days=(DAYS * k) // args.campaigns)
        campaign = Campaign.objects.create(
            organization=org, name=f"Bench {k}", channel=channel, status=Campaign.Status.SENT, started_at=sent
        )
        model = EmailMessage if channel == Channel.EMAIL else WhatsappMessage
        # Customers k*step, k*step+1, … (wrapping): campaigns overlap on some customers, so last
        # touch across campaigns and channels matters. Sent over six hours from the campaign's start.
        _insert(
            model,
            ("campaign_id", "organization_id", "customer_id", "status", "token", "queued_at", "sent_at"),
            "SELECT %s, %s, %s + (g * 7 + %s) %% %s, 'sent', 'bench-' || %s || '-' || g, %s::timestamptz, "
            "%s::timestamptz + (g %% 21600) * interval '1 second' FROM generate_series(0::bigint, %s - 1) g",
            [
                campaign.pk,
                org.pk,
                first_customer,
                k * (args.customers // args.campaigns),
                args.customers,
                campaign.pk,
                sent,
                sent,
                per_campaign,
            ],
        )
        print(f"  world: campaign {k + 1}/{args.campaigns} ({time.monotonic() - began:.0f}s)", flush=True)
    # Sales: a pseudo-random customer (or none, one in ten), store and time in the half year.
    _insert(
        Sale,
        ("organization_id", "store_id", "customer_id", "erp_id", "total", "sold_at", "items", "created_at"),
        "SELECT %s, %s + g %% %s, CASE WHEN g %% 10 = 9 THEN NULL ELSE %s + (g * 7919) %% %s END, "
        "'BS' || g, ((g * 37) %% 90000 + 990) / 100.0, "
        "%s::timestamptz + ((g * 104729) %% (%s * 86400)) * interval '1 second', '[]'::jsonb, now() "
        "FROM generate_series(1::bigint, %s) g",
        [org.pk, stores[0].pk, STORES, first_customer, args.customers, START, DAYS, args.sales],
    )
    print(f"  world: {args.sales:,} sales ({time.monotonic() - began:.0f}s)", flush=True)
    for table in ("crm_customer", "crm_sale", "campaigns_whatsappmessage", "campaigns_emailmessage"):
        _execute(f"ANALYZE {table}")
    return org


def timed(label: str, fn, rows: int | None = None):
    with CaptureQueriesContext(connection) as queries:
        started = time.monotonic()
        result = fn()
        seconds = time.monotonic() - started
    n = rows if rows is not None else result
    rate = f"{n / seconds:>12,.0f} rows/s" if isinstance(n, int) and seconds else " " * 19
    print(f"{label:<52} {seconds:8.3f}s {rate}  {len(queries):5d} queries")
    return result, seconds, len(queries)


def baseline(org: Organization, sales: int) -> None:
    """A plain INSERT … SELECT of `sales` rows into a copy of the attribution table: no lookup."""
    _execute("DROP TABLE IF EXISTS bench_attribution_copy")
    _execute("CREATE TABLE bench_attribution_copy (LIKE campaigns_saleattribution INCLUDING ALL)")
    campaign_id = Campaign.objects.filter(organization=org).values_list("pk", flat=True).first()

    def copy() -> int:
        with transaction.atomic():
            return _execute(
                "INSERT INTO bench_attribution_copy (sale_id, campaign_id, organization_id, store_id, total, "
                "sold_at, channel, message_id, message_sent_at, attributed_at) "
                "SELECT id, %s, organization_id, store_id, total, sold_at, 'whatsapp', id, sold_at, now() "
                "FROM crm_sale WHERE organization_id = %s",
                [campaign_id, org.pk],
            )

    timed(f"baseline: INSERT … SELECT of {sales:,} rows", copy)
    _execute("DROP TABLE bench_attribution_copy")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--sales", type=int, default=3_000_000)
    parser.add_argument("--customers", type=int, default=500_000)
    parser.add_argument("--campaigns", type=int, default=10)
    parser.add_argument(
        "--page", type=int, default=attribution.PAGE_IDS, help="sale ids per refresh statement"
    )
    args = parser.parse_args()
    ensure_database()
    org = ensure_world(args)
    sales = Sale.objects.filter(organization=org).count()
    messages = sum(m.objects.filter(organization_id=org.pk).count() for m in (WhatsappMessage, EmailMessage))
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
    print(
        f"organization {org.slug}: {sales:,} sales, {messages:,} messages, "
        f"window {org.attribution_window_days} days, PostgreSQL {version}"
    )
    SaleAttribution.objects.filter(organization=org).delete()  # a clean start (the rollup follows)
    _execute("VACUUM ANALYZE campaigns_saleattribution")
    _execute("VACUUM ANALYZE campaigns_campaignrevenue")

    baseline(org, sales)

    def refresh() -> int:
        return attribution.organization_attribute(organization_id=org.pk, page_ids=args.page).sales

    (_, seconds, _) = timed(f"refresh: every sale (pages of {args.page:,} ids)", refresh)
    attributed = SaleAttribution.objects.filter(organization=org).count()
    print(f"  {attributed:,} sales attributed ({100 * attributed / max(sales, 1):.1f}%)")
    _execute("VACUUM ANALYZE campaigns_saleattribution")
    timed("refresh again (nothing changes, nothing written)", refresh)

    # ERP-sized pages: 1,000 sales by ERP id, as erp.services.sales_sync attributes each page.
    pages = 20
    erp_ids = list(
        Sale.objects.filter(organization=org).order_by("-pk").values_list("erp_id", flat=True)[: 1000 * pages]
    )

    def incremental() -> int:
        done = 0
        for i in range(pages):
            done += attribution.sales_attribute(
                organization_id=org.pk, erp_ids=erp_ids[i * 1000 : (i + 1) * 1000]
            ).sales
        return done

    (_, seconds, queries) = timed(f"incremental: {pages} pages of 1,000 sales by ERP id", incremental)
    print(f"  {1000 * seconds / pages:.1f} ms and {queries // pages} queries per page")

    # Reads: the campaign page's figures from the rollup, against counting the attribution rows.
    top = (
        SaleAttribution.objects.filter(organization=org)
        .values("campaign_id")
        .annotate(n=django.db.models.Count("pk"))
        .order_by("-n")
        .first()
    )
    if top:
        campaign_id = top["campaign_id"]

        def rollup() -> int:
            for _ in range(100):
                figures = selectors.campaign_attribution(campaign_id=campaign_id)
            return figures.conversions

        def aggregate() -> int:
            for _ in range(100):
                row = SaleAttribution.objects.filter(campaign_id=campaign_id).aggregate(
                    revenue=django.db.models.Sum("total"), conversions=django.db.models.Count("pk")
                )
            return row["conversions"]

        print(f"campaign {campaign_id}: {top['n']:,} attributed sales")
        _, rollup_s, _ = timed("read: campaign figures from the rollup (x100)", rollup, rows=0)
        _, aggregate_s, _ = timed("read: the same by an indexed aggregate (x100)", aggregate, rows=0)
        print(f"  per read: rollup {10 * rollup_s:.2f} ms, aggregate {10 * aggregate_s:.2f} ms")
    until = START + timedelta(days=DAYS)
    timed(
        "read: revenue per store over 30 days",
        lambda: len(
            dashboards.revenue_by_store(organization_id=org.pk, since=until - timedelta(days=30), until=until)
        ),
        rows=0,
    )


if __name__ == "__main__":
    main()
