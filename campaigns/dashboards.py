"""Reads behind the admin's charts: a campaign's events over time, an organization's last 30 days."""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db.models import Count, DateTimeField, DurationField, Func, Max, Q, QuerySet, Sum, Value
from django.utils import timezone
from django.utils.translation import get_language
from django.utils.translation import gettext_lazy as _
from redis.exceptions import RedisError

from campaigns.models import Campaign, CampaignMetric, Channel, EmailMessage, SaleAttribution, WhatsappMessage
from crm import jobs
from crm.models import Store
from crm.money import DEFAULT_CURRENCY
from messaging.models import ConversationMessage

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
    now = timezone.now()
    end = min(_series_end(campaign, messages, kinds, start, live=live), now)
    step, first, count = buckets(start, max(end, start), origin)
    if not live:
        # A finished campaign of a few minutes still gets a readable time axis (its minutes and the
        # quiet after them) instead of a lone point.
        count = max(count, MIN_POINTS)
    # The chart stops at now: no bucket, and no axis, in the future (a stamp ahead of the clock too);
    # a campaign that finished a moment ago gets its readable axis from the quiet before it instead.
    count = max(1, min(count, int((now - first).total_seconds()) // step + 1))
    if not live and count < MIN_POINTS:
        first -= timedelta(seconds=step * (MIN_POINTS - count))
        count = MIN_POINTS
    counts, costs = _bucket_counts(campaign, messages, kinds, timedelta(seconds=step), origin)
    stamps = [first + timedelta(seconds=step * i) for i in range(count)]
    result["bucket_seconds"] = step
    result["timestamps"] = [int(t.timestamp()) for t in stamps]
    axis_end = min(int(first.timestamp()) + step * max(count, MIN_POINTS), int(now.timestamp()))
    result["x_range"] = [int(first.timestamp()), max(axis_end, result["timestamps"][-1])]
    # A stamp ahead of the clock (Meta's a second ahead of ours) counts in the last bucket, so the
    # series always add up to the totals.
    last = stamps[-1]
    for s in kinds:
        by_bucket = counts.get(s.key, {})
        values = [by_bucket.get(t, 0) for t in stamps]
        values[-1] += sum(n for t, n in by_bucket.items() if t > last)
        result["series"][s.key] = values
        result["totals"][s.key] = sum(by_bucket.values())
    running = Decimal("0")
    cumulative = []
    for t in stamps:
        running += costs.get(t, Decimal("0"))
        cumulative.append(float(running))
    running += sum((c for t, c in costs.items() if t > last), Decimal("0"))
    cumulative[-1] = float(running)
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
