"""Reads behind the admin's charts: a campaign's events over time, an organization's last 30 days."""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db.models import Count, DateTimeField, DurationField, Func, Max, Q, QuerySet, Sum, Value
from django.db.models.functions import TruncDate
from django.utils import timezone
from django.utils.translation import get_language
from django.utils.translation import gettext_lazy as _
from redis.exceptions import RedisError

from campaigns.models import Campaign, CampaignMetric, Channel, EmailMessage, SaleAttribution, WhatsappMessage
from crm import jobs
from crm.models import Organization, Store
from crm.money import DEFAULT_CURRENCY
from messaging.models import ConversationMessage
from surveys.selectors import NpsRow, nps_by_store_and_month

# Bucket widths in seconds, smallest first; each is a multiple of a minute.
BUCKET_STEPS = (
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    2 * 3600,
    3 * 3600,
    6 * 3600,
    12 * 3600,
    86400,
    2 * 86400,
    7 * 86400,
    30 * 86400,
)
MAX_POINTS = 300
MIN_POINTS = 10
# While these last, "now" is the end of the chart (and the page keeps refreshing it).
LIVE_STATUSES = (Campaign.Status.SENDING, Campaign.Status.PAUSED, Campaign.Status.SCHEDULED)
DASHBOARD_DAYS = 30
DASHBOARD_MAX_CAMPAIGNS = 200


@dataclass(frozen=True)
class Series:
    key: str  # the name in the JSON
    column: str  # the timestamp it is bucketed by
    status: str | None = None  # only messages in this status (email: a failure is bounced, blocked or failed)
    exclude_statuses: tuple[str, ...] = ()


WHATSAPP_SERIES = (
    Series("sent", "sent_at"),
    Series("delivered", "delivered_at"),
    Series("read", "read_at"),
    Series("clicked", "clicked_at"),
    Series("failed", "failed_at"),
)
EMAIL_SERIES = (
    Series("sent", "sent_at"),
    Series("opened", "opened_at"),
    Series("clicked", "clicked_at"),
    Series("bounced", "failed_at", status=EmailMessage.Status.BOUNCED),
    Series("blocked", "failed_at", status=EmailMessage.Status.BLOCKED),
    Series(
        "failed", "failed_at", exclude_statuses=(EmailMessage.Status.BOUNCED, EmailMessage.Status.BLOCKED)
    ),
)


# The charts' legend.
LABELS = {
    "sent": _("sent"),
    "delivered": _("delivered"),
    "read": _("read"),
    "opened": _("opened"),
    "clicked": _("clicked"),
    "bounced": _("bounced"),
    "blocked": _("blocked"),
    "failed": _("failed"),
}


class DateBin(Func):
    """The start of the `step`-wide bucket holding the expression, buckets aligned on `origin`
    (PostgreSQL's date_bin)."""

    function = "date_bin"
    output_field = DateTimeField()

    def __init__(self, step: timedelta, expression: Any, origin: datetime) -> None:
        super().__init__(
            Value(step, output_field=DurationField()),
            expression,
            Value(origin, output_field=DateTimeField()),
        )


def buckets(start: datetime, end: datetime, origin: datetime) -> tuple[int, datetime, int]:
    """The smallest bucket width (seconds) covering start..end in at most MAX_POINTS buckets aligned
    on `origin`, with the first bucket's start and the number of buckets."""
    for step in BUCKET_STEPS:
        first = origin + timedelta(seconds=step * math.floor((start - origin).total_seconds() / step))
        count = math.floor((end - first).total_seconds() / step) + 1
        if count <= MAX_POINTS:
            break
    return step, first, count


def _local_midnight(moment: datetime, zone: ZoneInfo) -> datetime:
    """The start of `moment`'s day in `zone`, in UTC: bucket times are then added in absolute time,
    as PostgreSQL's date_bin adds them (a local datetime plus a timedelta is wall-clock arithmetic,
    an hour off after a daylight-saving change)."""
    local = moment.astimezone(zone)
    return local.replace(hour=0, minute=0, second=0, microsecond=0).astimezone(UTC)


# How long a campaign's series is reused (seconds): a sending campaign's page polls every 10 s; a
# finished one changes only as late reads and clicks arrive. A 500,000-message campaign costs about
# a second to compute, so a page (re)opened by several operators computes it once.
SERIES_CACHE_SECONDS = {True: 5, False: 60}


def campaign_series_cached(*, campaign: Campaign) -> dict[str, Any]:
    """campaign_series through a short Redis cache (per campaign, status and language)."""
    key = f"crm:campaign-series:{campaign.pk}:{campaign.status}:{get_language()}"
    connection = jobs.get_connection()
    try:
        raw = connection.get(key)
    except RedisError:
        raw = None
    if raw:
        return json.loads(raw)
    data = campaign_series(campaign=campaign)
    with contextlib.suppress(RedisError):
        connection.set(key, json.dumps(data), ex=SERIES_CACHE_SECONDS[bool(data["live"])])
    return data


def campaign_series(*, campaign: Campaign) -> dict[str, Any]:
    """Messages per time bucket and status, and the cumulative cost, for the campaign's charts.

    One aggregate for the time span, then one GROUP BY per timestamp column; at most MAX_POINTS
    buckets whatever the campaign's size, aligned on midnight in the organization's time zone.
    """
    kinds = EMAIL_SERIES if campaign.channel == Channel.EMAIL else WHATSAPP_SERIES
    zone = ZoneInfo(campaign.organization.timezone)
    messages = campaign.message_model.objects.filter(campaign_id=campaign.pk)
    live = campaign.status in LIVE_STATUSES
    result = _empty_series(campaign, kinds, zone, live=live)
    # Messages exist only once the campaign has started, so nothing happened before started_at.
    start = campaign.started_at
    if start is None:
        return result
    origin = _local_midnight(start, zone)
    step, first, count = buckets(start, _series_end(campaign, messages, kinds, start, live=live), origin)
    if not live:
        # A finished campaign of a few minutes still gets a readable time axis (its minutes and the
        # quiet after them) instead of a lone point.
        count = max(count, MIN_POINTS)
    counts, costs = _bucket_counts(campaign, messages, kinds, timedelta(seconds=step), origin)
    stamps = [first + timedelta(seconds=step * i) for i in range(count)]
    result["bucket_seconds"] = step
    result["timestamps"] = [int(t.timestamp()) for t in stamps]
    result["x_range"] = [int(first.timestamp()), int(first.timestamp()) + step * max(count, MIN_POINTS)]
    for s in kinds:
        by_bucket = counts.get(s.key, {})
        result["series"][s.key] = [by_bucket.get(t, 0) for t in stamps]
        result["totals"][s.key] = sum(by_bucket.values())
    running = Decimal("0")
    cumulative = []
    for t in stamps:
        running += costs.get(t, Decimal("0"))
        cumulative.append(float(running))
    result["cost"] = cumulative
    result["cost_total"] = str(running.quantize(Decimal("0.000001")))
    return result


def _empty_series(
    campaign: Campaign, kinds: tuple[Series, ...], zone: ZoneInfo, *, live: bool
) -> dict[str, Any]:
    """The campaign's series before any bucket: what a campaign that has not started shows."""
    return {
        "id": campaign.pk,
        "channel": campaign.channel,
        "status": campaign.status,
        "time_zone": zone.key,
        "live": live,
        "bucket_seconds": BUCKET_STEPS[0],
        "timestamps": [],
        "series": {s.key: [] for s in kinds},
        "labels": {s.key: str(LABELS[s.key]) for s in kinds},
        "totals": dict.fromkeys((s.key for s in kinds), 0),
        "cost": [],
        "cost_total": "0.000000",
        # The cost's currency (ISO 4217): the campaign total's, never reais by assumption.
        "currency": CampaignMetric.objects.filter(campaign_id=campaign.pk)
        .values_list("cost_currency", flat=True)
        .first()
        or DEFAULT_CURRENCY,
        # The time axis: at least MIN_POINTS buckets wide, so a campaign's first minutes get a
        # readable axis (its minutes, in the organization's zone) rather than a lone point.
        "x_range": [],
    }


def _series_end(
    campaign: Campaign, messages: QuerySet, kinds: tuple[Series, ...], start: datetime, *, live: bool
) -> datetime:
    """Where the chart ends: now while the campaign is live, else its last event."""
    if live:
        return timezone.now()
    # Deliveries, reads and clicks keep coming after the last send: the chart runs to the last one.
    lasts = messages.aggregate(**{c: Max(c) for c in sorted({s.column for s in kinds})})
    return max([start, campaign.finished_at or start, *(t for t in lasts.values() if t is not None)])


def _bucket_counts(
    campaign: Campaign, messages: QuerySet, kinds: tuple[Series, ...], width: timedelta, origin: datetime
) -> tuple[dict[str, dict[datetime, int]], dict[datetime, Decimal]]:
    """Each series' count per bucket start, and the cost per bucket (WhatsApp): one GROUP BY per
    timestamp column."""
    counts: dict[str, dict[datetime, int]] = {}
    costs: dict[datetime, Decimal] = {}
    for column in sorted({s.column for s in kinds}):
        wanted = [s for s in kinds if s.column == column]
        aggregates: dict[str, Any] = {
            s.key: Count(
                "pk",
                filter=Q(status=s.status)
                if s.status
                else (~Q(status__in=s.exclude_statuses) if s.exclude_statuses else None),
            )
            for s in wanted
        }
        if column == "sent_at" and campaign.message_model is WhatsappMessage:
            aggregates["cost"] = Sum("cost")
        rows = (
            messages.filter(**{f"{column}__isnull": False})
            .annotate(bucket=DateBin(width, column, origin))
            .values("bucket")
            .annotate(**aggregates)
            .order_by()
        )
        for row in rows:
            bucket = row["bucket"]
            if timezone.is_naive(bucket):
                bucket = bucket.replace(tzinfo=UTC)
            for s in wanted:
                counts.setdefault(s.key, {})[bucket] = row[s.key]
            if "cost" in row:
                costs[bucket] = row["cost"] or Decimal("0")
    return counts, costs


@dataclass(frozen=True)
class CampaignRow:
    campaign: Campaign
    queued: int = 0
    sent: int = 0
    delivered: int = 0
    read: int = 0
    clicked: int = 0
    failed: int = 0  # bounced and blocked included
    cost: Decimal = Decimal("0")
    cost_currency: str = "USD"
    revenue: Decimal = Decimal("0")  # attributed sales (campaigns.attribution), whenever sold
    conversions: int = 0

    @classmethod
    def of(cls, campaign: Campaign) -> CampaignRow:
        attributed = getattr(campaign, "attributed", None)  # select_related: None when it has none
        sold = {"revenue": attributed.revenue, "conversions": attributed.conversions} if attributed else {}
        metric = getattr(campaign, "metric", None)  # select_related: None when it has none
        if metric is None:
            return cls(campaign, **sold)
        return cls(
            campaign,
            **sold,
            queued=metric.queued,
            sent=metric.sent,
            delivered=metric.delivered,
            read=metric.read,
            clicked=metric.clicked,
            failed=metric.failed + metric.bounced + metric.blocked,
            cost=metric.cost,
            cost_currency=metric.cost_currency,
        )


@dataclass(frozen=True)
class StoreRevenue:
    store_id: int
    store_name: str
    revenue: Decimal
    conversions: int


def revenue_by_store(*, organization_id: int, since: datetime, until: datetime) -> list[StoreRevenue]:
    """Attributed sales sold in [since, until) per store, largest revenue first: one GROUP BY over
    the attributions' (organization, sold_at) index, which holds the store and the total."""
    rows = (
        SaleAttribution.objects.filter(organization_id=organization_id, sold_at__gte=since, sold_at__lt=until)
        .values("store_id")
        .annotate(revenue=Sum("total"), conversions=Count("pk"))
        .order_by()
    )
    totals = {row["store_id"]: row for row in rows}
    names = dict(Store.objects.filter(pk__in=totals).values_list("pk", "name"))
    return sorted(
        (
            StoreRevenue(store_id, names.get(store_id, f"#{store_id}"), row["revenue"], row["conversions"])
            for store_id, row in totals.items()
        ),
        key=lambda row: (-row.revenue, row.store_name),
    )


@dataclass(frozen=True)
class OrganizationDashboard:
    since: datetime  # local midnight, DASHBOARD_DAYS - 1 days before today
    until: datetime
    campaigns: list[CampaignRow]  # started in the window, newest first
    more_campaigns: bool  # more than DASHBOARD_MAX_CAMPAIGNS started in the window
    days: list[dict[str, Any]]  # per local day: whatsapp_sent, email_sent, cost by currency
    nps: NpsRow  # every store together (month: the window's first day)
    nps_stores: list[NpsRow]
    stores: list[StoreRevenue]  # attributed sales sold in the window, per store
    replies: list[StoreReplies] = field(default_factory=list)  # WhatsApp replies in the window, per store


@dataclass(frozen=True)
class StoreReplies:
    store_id: int | None
    store_name: str
    replies: int  # messages customers sent to the store's numbers
    customers: int  # customers who wrote


def replies_by_store(*, organization_id: int, since: datetime, until: datetime) -> list[StoreReplies]:
    """Inbound WhatsApp messages in [since, until) per store of the receiving number, most first: one
    GROUP BY over the (organization, at) index of inbound messages."""
    rows = (
        ConversationMessage.objects.filter(
            organization_id=organization_id,
            direction=ConversationMessage.Direction.INBOUND,
            at__gte=since,
            at__lt=until,
        )
        .values("store_id", "store__name")
        .annotate(replies=Count("id"), customers=Count("customer_id", distinct=True))
        .order_by("-replies", "store_id")
    )
    return [StoreReplies(r["store_id"], r["store__name"] or "", r["replies"], r["customers"]) for r in rows]


def _window(organization: Organization, now: datetime) -> tuple[datetime, datetime]:
    zone = ZoneInfo(organization.timezone)
    today = now.astimezone(zone).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=DASHBOARD_DAYS - 1), now  # local midnights, whatever the offsets


def nps_window(
    *, organization: Organization, since: datetime, until: datetime
) -> tuple[NpsRow, list[NpsRow]]:
    """NPS of the answers in [since, until), every store together and per store (one GROUP BY).

    The per-store-and-month counts are added up per store: never an average of NPSs.
    """
    rows = nps_by_store_and_month(organization=organization, since=since, until=until)
    first_day = since.astimezone(ZoneInfo(organization.timezone)).date()
    per_store: dict[int | None, list[Any]] = {}
    for row in rows:
        entry = per_store.setdefault(row.store_id, [row.store_name, 0, 0, 0])
        entry[1] += row.responses
        entry[2] += row.promoters
        entry[3] += row.detractors
    stores = sorted(
        (
            NpsRow.of(
                month=first_day, store_id=store_id, store_name=name, responses=r, promoters=p, detractors=d
            )
            for store_id, (name, r, p, d) in per_store.items()
        ),
        key=lambda row: (row.store_name, row.store_id or 0),
    )
    total = NpsRow.of(
        month=first_day,
        store_id=None,
        store_name="",
        responses=sum(s.responses for s in stores),
        promoters=sum(s.promoters for s in stores),
        detractors=sum(s.detractors for s in stores),
    )
    return total, stores


def organization_dashboard(
    *, organization: Organization, now: datetime | None = None
) -> OrganizationDashboard:
    """The organization's last DASHBOARD_DAYS days in its time zone: five queries, none over messages
    or sales."""
    since, until = _window(organization, now or timezone.now())
    zone = ZoneInfo(organization.timezone)
    started = Campaign.objects.filter(
        organization_id=organization.pk, started_at__gte=since, started_at__lt=until
    )
    campaigns = list(
        started.select_related("metric", "attributed").order_by("-started_at", "-pk")[
            : DASHBOARD_MAX_CAMPAIGNS + 1
        ]
    )
    # Sends are counted on the day their campaign started (its metric): bounded by the number of
    # campaigns, where the messages' own timestamps would mean scanning every message of the month.
    per_day: dict[date, dict[str, Any]] = {}
    # Grouped by currency too: a day's costs in two currencies are two amounts, never one sum.
    for row in (
        CampaignMetric.objects.filter(campaign__in=started)
        .annotate(day=TruncDate("campaign__started_at", tzinfo=zone))
        .values("day", "cost_currency")
        .annotate(
            whatsapp_sent=Sum("sent", filter=Q(campaign__channel=Channel.WHATSAPP)),
            email_sent=Sum("sent", filter=Q(campaign__channel=Channel.EMAIL)),
            cost=Sum("cost"),
        )
        .order_by()
    ):
        day_row = per_day.setdefault(row["day"], {"whatsapp_sent": 0, "email_sent": 0, "cost": {}})
        day_row["whatsapp_sent"] += row["whatsapp_sent"] or 0
        day_row["email_sent"] += row["email_sent"] or 0
        if row["cost"]:
            day_row["cost"][row["cost_currency"]] = row["cost"]
    first_day: date = since.astimezone(zone).date()
    days = []
    for i in range(DASHBOARD_DAYS):
        day = first_day + timedelta(days=i)
        row = per_day.get(day, {})
        days.append(
            {
                "day": day,
                "whatsapp_sent": row.get("whatsapp_sent") or 0,
                "email_sent": row.get("email_sent") or 0,
                "cost": row.get("cost") or {},  # by currency (ISO 4217)
            }
        )
    nps, nps_stores = nps_window(organization=organization, since=since, until=until)
    return OrganizationDashboard(
        since=since,
        until=until,
        campaigns=[CampaignRow.of(c) for c in campaigns[:DASHBOARD_MAX_CAMPAIGNS]],
        more_campaigns=len(campaigns) > DASHBOARD_MAX_CAMPAIGNS,
        days=days,
        nps=nps,
        nps_stores=nps_stores,
        stores=revenue_by_store(organization_id=organization.pk, since=since, until=until),
        replies=replies_by_store(organization_id=organization.pk, since=since, until=until),
    )
