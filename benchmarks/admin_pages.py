"""Admin pages over big tables: response time and queries of the message lists and a campaign's pages.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/crm_admin_bench REDIS_URL=redis://127.0.0.1:6379/4 \\
    SECRET_KEY=... ENCRYPTION_KEY=... .venv/bin/python benchmarks/admin_pages.py [--messages 1000000]

Uses (and creates and migrates if missing) the database in DATABASE_URL and keeps a
`bench-admin-N` organization between runs: 20 WhatsApp campaigns holding N messages (one of them
N/2, one still sending with queued rows), two email campaigns holding N/10 emails, and as many
customers as the biggest campaign has recipients. Everything is seeded in SQL (INSERT … SELECT over
generate_series and the customers), so the process stays small; then VACUUM ANALYZE, as
autovacuum leaves a long-lived table.

Each page is requested by a logged-in superuser through django.test.Client (DEBUG off): one
warm-up, then the median of 5 in ms, the queries of the last request, and PASS/FAIL against
500 ms. The "before" rows are the same WhatsApp message list with the admin configuration it had
before (Django's stock Paginator: a COUNT(*) of the whole table; the error-code filter's SELECT
DISTINCT; `iexact` searches that compare UPPER() of every row; OFFSET over the joins), mounted on a
second admin site. They run on today's schema (the indexes of campaigns' migration 0006 speed
their filters up too), so they show the admin configuration's share of the gain.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib import admin  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.db import connection, models, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import path  # noqa: E402

from benchmarks.common import ensure_database  # noqa: E402
from campaigns.admin.sent_messages import WhatsappMessageAdmin  # noqa: E402
from campaigns.models import Campaign, CampaignMetric, Channel, EmailMessage, WhatsappMessage  # noqa: E402
from crm.models import Customer, Organization  # noqa: E402

TARGET_MS = 500.0
RUNS = 5
START = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
WHATSAPP_CAMPAIGNS = 20
BIG = 9  # the campaign holding half of the messages, in the middle of the history
EMAIL_AFTER = (4, 14)  # an email campaign is created after these WhatsApp campaigns


# --- the world ------------------------------------------------------------------------------------


def _insert_select(model: type[models.Model], given: dict[str, str], source: str) -> None:
    """INSERT INTO model's table SELECT `given` SQL per column (others: the field's default) FROM source."""
    q = connection.ops.quote_name
    columns, exprs, params = [], [], []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(q(field.column))
        if field.column in given:
            exprs.append(given[field.column])
        else:
            exprs.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    table = q(model._meta.db_table)
    sql = f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(exprs)} FROM {source}"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def ensure_customers(org: Organization, wanted: int) -> None:
    have = Customer.objects.filter(organization=org).count()
    if have >= wanted:
        return
    started = time.monotonic()
    _insert_select(
        Customer,
        {
            "organization_id": str(org.pk),
            "erp_id": "'AB' || g",
            "name": "'Cliente ' || g || ' Silva'",
            "email": "'cliente' || g || '@example.com.br'",
            "phone": "'+5511' || lpad(g::text, 9, '0')",
            "updated_at": "now()",
        },
        f"generate_series({have + 1}, {wanted}) AS g",
    )
    print(f"  seeded {wanted - have:,} customers in {time.monotonic() - started:.0f}s", flush=True)


def _rows(campaign: Campaign, n: int, status: str, step: str) -> str:
    """The campaign's first n customers as rows numbered g = 1..n, each with a spread bucket b in
    0..99, its status st (an SQL expression of g and b) and a time t, `step` apart from its start."""
    numbered = (
        "SELECT id AS customer_id, phone, email, row_number() OVER (ORDER BY id) AS g FROM crm_customer "  # noqa: S608
        f"WHERE organization_id = {campaign.organization_id} ORDER BY id LIMIT {n}"
    )
    spread = f"SELECT *, mod(g * 7919, 100) AS b FROM ({numbered}) numbered"  # noqa: S608
    start = f"TIMESTAMPTZ '{(campaign.started_at or START).isoformat()}'"
    return f"(SELECT *, {status} AS st, {start} + g * interval '{step}' AS t FROM ({spread}) spread) r"  # noqa: S608


def seed_whatsapp(campaign: Campaign, n: int, *, sending: bool) -> None:
    # Finished: read, delivered, sent, failed, skipped; the one still sending has its tail queued.
    status = (
        "CASE WHEN b < 45 THEN 'read' WHEN b < 75 THEN 'delivered' WHEN b < 88 THEN 'sent' "
        "WHEN b < 96 THEN 'failed' ELSE 'skipped' END"
    )
    if sending:
        tail = n * 7 // 10
        status = f"CASE WHEN g > {tail} THEN 'queued' WHEN g > {tail - 200} THEN 'sending' ELSE {status} END"
    went = "st IN ('sent', 'delivered', 'read')"
    wamid = f"'wamid.HBgN' || md5('{campaign.pk}:' || g)"
    codes = "ARRAY[131026, 131050, 130472, 131049]"
    _insert_select(
        WhatsappMessage,
        {
            "campaign_id": str(campaign.pk),
            "organization_id": str(campaign.organization_id),
            "customer_id": "customer_id",
            "batch": "(g - 1) / 500",
            "status": "st",
            "attempts": "CASE WHEN st = 'queued' THEN 0 ELSE 1 END",
            "phone": "phone",
            "wa_id": "substr(phone, 2)",
            "wamid": f"CASE WHEN {went} OR st = 'failed' THEN {wamid} END",
            "error_code": f"CASE WHEN st = 'failed' THEN ({codes})[1 + mod(g, 4)] END",
            "error_reason": "CASE WHEN st = 'failed' THEN 'Message undeliverable.' "
            "WHEN st = 'skipped' THEN 'customer opted out or has no consent' ELSE '' END",
            "cost": f"CASE WHEN {went} THEN 0.0625 ELSE 0 END",
            "token": f"'bw{campaign.pk}x' || customer_id",
            "queued_at": "t",
            "sending_at": "CASE WHEN st = 'sending' THEN now() END",
            "sent_at": f"CASE WHEN {went} THEN t END",
            "delivered_at": "CASE WHEN st IN ('delivered', 'read') THEN t + interval '3 s' END",
            "read_at": "CASE WHEN st = 'read' THEN t + b * interval '1 min' END",
            "failed_at": "CASE WHEN st = 'failed' THEN t END",
            "clicked_at": "CASE WHEN st = 'read' AND b < 5 THEN t + interval '2 h' END",
        },
        _rows(campaign, n, status, "20 ms"),
    )


def seed_email(campaign: Campaign, n: int) -> None:
    status = (
        "CASE WHEN b < 85 THEN 'sent' WHEN b < 91 THEN 'bounced' WHEN b < 93 THEN 'failed' ELSE 'skipped' END"
    )
    _insert_select(
        EmailMessage,
        {
            "campaign_id": str(campaign.pk),
            "organization_id": str(campaign.organization_id),
            "customer_id": "customer_id",
            "batch": "(g - 1) / 500",
            "status": "st",
            "attempts": "1",
            "email": "email",
            "smtp_reply": "CASE WHEN st = 'sent' THEN '250 2.0.0 Ok: queued' ELSE '' END",
            "bounce_type": "CASE WHEN st <> 'bounced' THEN '' WHEN b < 89 THEN 'hard' ELSE 'soft' END",
            "bounce_message": "CASE WHEN st = 'bounced' THEN '550 5.1.1 user unknown' ELSE '' END",
            "token": f"'be{campaign.pk}x' || customer_id",
            "queued_at": "t",
            "sent_at": "CASE WHEN st IN ('sent', 'bounced') THEN t END",
            "failed_at": "CASE WHEN st = 'failed' THEN t END",
            "opened_at": "CASE WHEN st = 'sent' AND b < 30 THEN t + b * interval '1 min' END",
            "clicked_at": "CASE WHEN st = 'sent' AND b < 6 THEN t + interval '2 h' END",
        },
        _rows(campaign, n, status, "200 ms"),
    )


def _count_metrics(campaign: Campaign) -> None:
    """The campaign's counters from its messages, as the send jobs would have left them."""
    email = campaign.channel == Channel.EMAIL
    rows = campaign.message_model.objects.filter(campaign=campaign)
    went = ["sent"] if email else ["sent", "delivered", "read"]
    counts = rows.aggregate(
        queued=models.Count("id"),
        sent=models.Count("id", filter=models.Q(status__in=went)),
        delivered=models.Count("id", filter=models.Q(status__in=["delivered", "read"])),
        read=models.Count("id", filter=models.Q(status="read")),
        failed=models.Count("id", filter=models.Q(status="failed")),
        skipped=models.Count("id", filter=models.Q(status="skipped")),
        bounced=models.Count("id", filter=models.Q(status="bounced")),
        clicked=models.Count("clicked_at"),
        **({"opened": models.Count("opened_at")} if email else {"cost": models.Sum("cost")}),  # type: ignore[dict-item]
    )
    CampaignMetric.objects.update_or_create(campaign=campaign, defaults=counts)


def ensure_world(messages: int) -> dict[str, Any]:
    """The organization, its customers, campaigns and messages; only what is missing is (re)seeded."""
    org, _ = Organization.objects.get_or_create(
        slug=f"bench-admin-{messages}", defaults={"name": f"Admin bench {messages:,}"}
    )
    big = messages // 2
    small = (messages - big) // (WHATSAPP_CAMPAIGNS - 1)
    sizes = [small] * WHATSAPP_CAMPAIGNS
    sizes[BIG] = big
    sizes[-1] += messages - big - small * (WHATSAPP_CAMPAIGNS - 1)
    emails = messages // 10
    ensure_customers(org, max(big, emails // 2, *sizes))
    plan: list[tuple[str, str, int]] = []
    for i, size in enumerate(sizes):
        plan.append((f"Bench WhatsApp {i + 1:02d}", Channel.WHATSAPP, size))
        if i in EMAIL_AFTER:
            plan.append((f"Bench email {EMAIL_AFTER.index(i) + 1}", Channel.EMAIL, emails // 2))
    campaigns: list[Campaign] = []
    started = time.monotonic()
    for position, (name, channel, size) in enumerate(plan):
        last = position == len(plan) - 1
        at = START + timedelta(days=7 * position)
        campaign, _ = Campaign.objects.get_or_create(
            organization=org,
            name=name,
            defaults={
                "channel": channel,
                "status": Campaign.Status.SENDING if last else Campaign.Status.SENT,
                "template_name": "promo_bench",
                "email_subject": "Ofertas da semana",
                "email_body": "<mjml><mj-body><mj-text>Olá {{ first_name }}</mj-text></mj-body></mjml>",
                "started_at": at,
                "finished_at": None if last else at + timedelta(hours=4),
                "created_at": at,
            },
        )
        campaigns.append(campaign)
        model = campaign.message_model
        if model.objects.filter(campaign=campaign).count() == size:
            continue
        with transaction.atomic():
            _delete_messages(model, campaign)
            if channel == Channel.EMAIL:
                seed_email(campaign, size)
            else:
                seed_whatsapp(campaign, size, sending=last)
            _count_metrics(campaign)
        print(
            f"  seeded {name}: {size:,} messages ({time.monotonic() - started:.0f}s)",
            flush=True,
        )
    with connection.cursor() as cursor:
        for table in (
            "crm_customer",
            "campaigns_campaign",
            "campaigns_whatsappmessage",
            "campaigns_emailmessage",
        ):
            cursor.execute(f"VACUUM (ANALYZE) {table}")
    by_channel = {c: [x for x in campaigns if x.channel == c] for c in (Channel.WHATSAPP, Channel.EMAIL)}
    return {"org": org, "whatsapp": by_channel[Channel.WHATSAPP], "email": by_channel[Channel.EMAIL]}


def _delete_messages(model: type[models.Model], campaign: Campaign) -> None:
    with connection.cursor() as cursor:  # raw: the ORM's delete() would load the rows for signals
        table = model._meta.db_table
        cursor.execute(f"DELETE FROM {table} WHERE campaign_id = %s", [campaign.pk])  # noqa: S608


# --- the pages ------------------------------------------------------------------------------------


class BeforeWhatsappMessageAdmin(admin.ModelAdmin):
    """The WhatsApp message list as it was configured before: Django's stock Paginator counts every row."""

    list_display = WhatsappMessageAdmin.list_display  # the same columns as the project's list
    list_select_related = WhatsappMessageAdmin.list_select_related
    list_filter = ("status", "error_code")
    search_fields = ("=phone", "=wamid", "=campaign__id")
    raw_id_fields = ("campaign", "customer", "organization")
    show_full_result_count = False


before_site = admin.AdminSite(name="before")
before_site.register(WhatsappMessage, BeforeWhatsappMessageAdmin)


class BenchUrls:
    """The project's URLs plus the "before" admin site at /before/."""

    urlpatterns = [
        path("before/", before_site.urls),
        *__import__(settings.ROOT_URLCONF, fromlist=["x"]).urlpatterns,
    ]


def measure(client: Client, url: str) -> tuple[float, int, int]:
    """(median ms, queries, status code) of RUNS requests after one warm-up."""
    client.get(url)
    times = []
    for _ in range(RUNS):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get(url)
            times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times), len(queries), response.status_code


def pages(world: dict[str, Any]) -> list[tuple[str, str]]:
    wa = "/admin/campaigns/whatsappmessage/"
    em = "/admin/campaigns/emailmessage/"
    big = world["whatsapp"][BIG]
    oldest = world["whatsapp"][0]
    message = WhatsappMessage.objects.filter(campaign=big).order_by("pk")[1000]
    wamid = WhatsappMessage.objects.filter(campaign=oldest, wamid__isnull=False).values_list(
        "wamid", flat=True
    )[7]
    email = EmailMessage.objects.filter(campaign=world["email"][0]).order_by("pk")[500]
    phone = message.phone.replace("+", "%2B")
    big_size = WhatsappMessage.objects.filter(campaign=big).count()
    return [
        ("WhatsApp messages", wa),
        ("  status = failed", f"{wa}?status__exact=failed"),
        ("  status = sending (200 rows)", f"{wa}?status__exact=sending"),
        ("  error code 131050", f"{wa}?error_code__exact=131050"),
        (f"  campaign {big.pk} ({big_size:,} rows)", f"{wa}?campaign__id__exact={big.pk}"),
        (f"  campaign {oldest.pk} (oldest)", f"{wa}?campaign__id__exact={oldest.pk}"),
        ("  campaign + status = failed", f"{wa}?campaign__id__exact={big.pk}&status__exact=failed"),
        ("  search a phone", f"{wa}?q={phone}"),
        ("  search a phone prefix", f"{wa}?q={phone[:-4]}"),
        ("  search a wamid", f"{wa}?q={wamid}"),
        ("  page 2000", f"{wa}?p=2000"),
        ("  a message's change page", f"{wa}{message.pk}/change/"),
        ("email messages", em),
        ("  status = bounced", f"{em}?status__exact=bounced"),
        ("  search an address", f"{em}?q={email.email}"),
        ("  an email's change page", f"{em}{email.pk}/change/"),
        ("campaigns", "/admin/campaigns/campaign/"),
        (f"  campaign {big.pk} change page", f"/admin/campaigns/campaign/{big.pk}/change/"),
        (f"  campaign {big.pk} status JSON", f"/admin/campaigns/campaign/{big.pk}/status/"),
        (f"  campaign {big.pk} series JSON", f"/admin/campaigns/campaign/{big.pk}/series/"),
        ("campaign metrics", "/admin/campaigns/campaignmetric/"),
        ("before: WhatsApp messages", "/before/campaigns/whatsappmessage/"),
        ("before:   status = failed", "/before/campaigns/whatsappmessage/?status__exact=failed"),
        (
            f"before:   campaign {oldest.pk} (oldest)",
            f"/before/campaigns/whatsappmessage/?campaign__id__exact={oldest.pk}",
        ),
        ("before:   search a phone", f"/before/campaigns/whatsappmessage/?q={phone}"),
        ("before:   page 2000", "/before/campaigns/whatsappmessage/?p=2000"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    args = parser.parse_args()
    ensure_database()
    started = time.monotonic()
    world = ensure_world(args.messages)
    print(
        f"organization {world['org'].slug}: {WhatsappMessage.objects.count():,} WhatsApp messages, "
        f"{EmailMessage.objects.count():,} emails, {Customer.objects.count():,} customers, "
        f"{Campaign.objects.count():,} campaigns (ready in {time.monotonic() - started:.0f}s)"
    )
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    settings.ROOT_URLCONF = BenchUrls
    user, _ = User.objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    print(f"\n{'page':<40} {'ms':>8} {'queries':>8}  target {TARGET_MS:.0f} ms")
    for label, url in pages(world):
        ms, queries, code = measure(client, url)
        if code == 404 and url.endswith("/series/"):
            print(f"{label:<40} {'—':>8} {'—':>8}  skipped: no such page here yet")
            continue
        verdict = ("PASS" if ms < TARGET_MS else "FAIL") if code == 200 else f"HTTP {code}"
        print(f"{label:<40} {ms:8.1f} {queries:8d}  {verdict}", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak memory of this process: {peak:.0f} MB")


if __name__ == "__main__":
    main()
