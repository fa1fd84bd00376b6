"""Reads about campaigns that more than one place uses."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db.models import BooleanField, Count, Exists, OuterRef, Q, QuerySet, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import Lower
from django.utils import timezone

from campaigns import lift
from campaigns.models import (
    Campaign,
    CampaignMetric,
    CampaignRevenue,
    Channel,
    CustomerSegment,
    EmailMessage,
    SaleAttribution,
    WhatsappMessage,
)
from crm.customer_filters import CustomerFilter
from crm.holdout import holdout_sql
from crm.models import Customer, Sale
from crm.money import DEFAULT_CURRENCY, cost_estimate, format_cost
from integrations.models import WhatsappNumber
from integrations.services import whatsapp_price_currency
from messaging.models import ConversationMessage, EmailSuppression

COUNT_KEYS = (
    "queued",
    "sending",
    "sent",
    "delivered",
    "read",
    "bounced",
    "blocked",  # email refused by the receiving server's policy (the address is kept)
    "failed",
    # WhatsApp: settled without knowing whether Meta accepted it; a late status webhook moves it on
    "unknown",
    "skipped",
    "cancelled",
    # In the campaign's control group (campaigns.lift): never sent.
    "held_out",
)
# Counted once per message from the metrics, not from the message statuses.
ENGAGEMENT_KEYS = ("opened", "clicked")


def campaign_audience(*, campaign: Campaign) -> QuerySet[Customer]:
    """Customers of the campaign's organization who can receive it, narrowed by its filters, without
    the organization's global holdout."""
    return _narrowed(campaign, _without_holdout(campaign, _reachable(campaign)))


def _reachable(campaign: Campaign) -> QuerySet[Customer]:
    """Customers with a recorded consent, not opted out of the channel, with a phone or address."""
    qs = Customer.objects.filter(organization_id=campaign.organization_id, marketing_consent=True)
    if campaign.channel == "whatsapp":
        qs = qs.filter(whatsapp_opted_out_at__isnull=True).exclude(phone="")
    else:
        qs = qs.filter(email_opted_out_at__isnull=True).exclude(email="")
        # Suppressed addresses (hard bounces, complaints) are stored lower-cased.
        suppressed = EmailSuppression.objects.filter(
            organization_id=campaign.organization_id, email=Lower(OuterRef("email"))
        )
        qs = qs.filter(~Exists(suppressed))
    return qs


def _without_holdout(campaign: Campaign, qs: QuerySet[Customer]) -> QuerySet[Customer]:
    """`qs` without the organization's global holdout (crm.holdout): marketing never reaches it."""
    condition, params = holdout_sql(
        customer_column=f"{Customer._meta.db_table}.id", organization=campaign.organization
    )
    if not params:
        return qs
    held_out = RawSQL(condition, params, output_field=BooleanField())  # noqa: S611 - values as parameters
    return qs.alias(_held_out=held_out).filter(_held_out=False)


def campaign_audience_counts(*, campaign: Campaign) -> dict[str, int]:
    """Before the start: who the audience's filters select, and why those who will not receive it
    are left out — "no_consent" (no recorded marketing consent), "opted_out" (of this channel), and
    "no_contact" (no phone or address). "receives" is campaign_audience's count (suppressed email
    addresses excluded too), "global_holdout" those of the organization's global holdout. Two (three
    with a holdout) aggregate queries; contact caps are applied when it sends."""
    channel_out = (
        Q(email_opted_out_at__isnull=False)
        if campaign.channel == Channel.EMAIL
        else Q(whatsapp_opted_out_at__isnull=False)
    )
    no_contact = Q(email="") if campaign.channel == Channel.EMAIL else Q(phone="")
    consent = Q(marketing_consent=True)
    selected = _narrowed(campaign, Customer.objects.filter(organization_id=campaign.organization_id))
    counts = selected.aggregate(
        selected=Count("pk"),
        no_consent=Count("pk", filter=~consent),
        opted_out=Count("pk", filter=consent & channel_out),
        no_contact=Count("pk", filter=consent & ~channel_out & no_contact),
    )
    receives = campaign_audience(campaign=campaign).count()
    held = 0
    if campaign.organization.holdout_percent:
        held = _narrowed(campaign, _reachable(campaign)).count() - receives
    return {**counts, "receives": receives, "global_holdout": held}


def _narrowed(campaign: Campaign, qs: QuerySet[Customer]) -> QuerySet[Customer]:
    """`qs` narrowed by the campaign's audience filters: store, recent purchase, RFM segment, and its
    customer filter (crm.customer_filters)."""
    sales = Sale.objects.filter(customer_id=OuterRef("pk"))
    if campaign.audience_store_id:
        sales = sales.filter(store_id=campaign.audience_store_id)
    if campaign.audience_purchased_within_days:
        sales = sales.filter(
            sold_at__gte=timezone.now() - timedelta(days=campaign.audience_purchased_within_days)
        )
    if campaign.audience_store_id or campaign.audience_purchased_within_days:
        qs = qs.filter(Exists(sales))
    if campaign.audience_segment:
        qs = qs.filter(Exists(_in_latest_segment(campaign.organization_id, campaign.audience_segment)))
    if campaign.audience_filter:
        terms = CustomerFilter.from_json(campaign.audience_filter)
        qs = terms.apply(qs, organization_id=campaign.organization_id)
    return qs


def segment_customers(organization_id: int, segment: str) -> QuerySet:
    """The ids of the organization's customers in `segment` in its newest snapshot (none before one):
    the customer filter's RFM segment term (crm.customer_filters)."""
    newest = CustomerSegment.objects.filter(organization_id=organization_id).order_by("-day").values("day")
    return CustomerSegment.objects.filter(
        organization_id=organization_id, day=Subquery(newest[:1]), segment=segment
    ).values("customer_id")


def _in_latest_segment(organization_id: int, segment: str) -> QuerySet[CustomerSegment]:
    """The customer's row in `segment` in the organization's newest snapshot (none before a first one)."""
    newest = CustomerSegment.objects.filter(organization_id=organization_id).order_by("-day").values("day")
    return CustomerSegment.objects.filter(
        organization_id=organization_id, day=Subquery(newest[:1]), segment=segment, customer_id=OuterRef("pk")
    )


def campaign_counts(*, campaign_id: int, channel: str = Channel.WHATSAPP) -> dict[str, int]:
    """Messages by status, in one GROUP BY."""
    model = EmailMessage if channel == Channel.EMAIL else WhatsappMessage
    rows = model.objects.filter(campaign_id=campaign_id).values("status").annotate(n=Count("id")).order_by()
    counts = dict.fromkeys(COUNT_KEYS, 0)
    counts.update({r["status"]: r["n"] for r in rows})
    return counts


@dataclass(frozen=True)
class CampaignAttribution:
    """What a campaign sold (campaigns.attribution): attributed revenue and sales, against the
    customers it reached (messages sent: one per customer) and what it cost."""

    revenue: Decimal  # in reais (the sales' currency)
    conversions: int
    buyers: int  # customers with at least one attributed sale
    reached: int
    cost: Decimal
    cost_currency: str = DEFAULT_CURRENCY
    # The cost in reais at the organization's conversion rate (None without one): an estimate.
    cost_estimate: Decimal | None = None

    @property
    def conversion_rate(self) -> Decimal | None:
        """Customers who bought per customer reached (one who bought twice counts once: at most 100%)."""
        return Decimal(self.buyers) / self.reached if self.reached else None

    @property
    def revenue_per_cost(self) -> Decimal | None:
        """Revenue ÷ cost only when both are in reais; None otherwise (see revenue_per_cost_estimate)."""
        if self.cost_currency != DEFAULT_CURRENCY:
            return None
        return self.revenue / self.cost if self.cost else None

    @property
    def revenue_per_cost_estimate(self) -> Decimal | None:
        """Revenue ÷ the cost converted at the organization's rate, when the currencies differ."""
        if self.cost_currency == DEFAULT_CURRENCY or not self.cost_estimate:
            return None
        return self.revenue / self.cost_estimate


def campaign_revenue(*, campaign_id: int) -> tuple[Decimal, int]:
    """The campaign's attributed (revenue, conversions) from its rollup row: one primary-key read."""
    row = (
        CampaignRevenue.objects.filter(campaign_id=campaign_id).values_list("revenue", "conversions").first()
    )
    return row if row else (Decimal("0"), 0)


def campaign_attribution(*, campaign_id: int) -> CampaignAttribution:
    """The campaign page's revenue figures: two primary-key reads, and the distinct buyers among
    the campaign's attributed sales (its index on campaign, each sale by primary key)."""
    revenue, conversions = campaign_revenue(campaign_id=campaign_id)
    metric = (
        CampaignMetric.objects.filter(campaign_id=campaign_id)
        .values_list(
            "sent",
            "cost",
            "cost_currency",
            "campaign__organization__cost_conversion_rate",
            "campaign__organization__cost_conversion_currency",
        )
        .first()
    )
    sent, cost, currency, rate, rate_currency = metric or (0, Decimal("0"), DEFAULT_CURRENCY, None, "")
    buyers = (
        SaleAttribution.objects.filter(campaign_id=campaign_id, sale__customer__isnull=False)
        .values("sale__customer_id")
        .distinct()
        .count()
        if conversions
        else 0
    )
    return CampaignAttribution(
        revenue=revenue,
        conversions=conversions,
        buyers=buyers,
        reached=sent,
        cost=cost,
        cost_currency=currency,
        cost_estimate=cost_estimate(cost, currency, rate=rate, rate_currency=rate_currency),
    )


def organization_paused(*, campaign: Campaign) -> str:
    """Why the organization's sending on the campaign's channel is paused (its provider or mail
    server refused the account), or "" when it is not: what holds all of the campaign's batches."""
    org = campaign.organization
    if campaign.channel == Channel.EMAIL:
        return (org.email_paused_reason or "paused") if org.email_paused_at else ""
    return (org.whatsapp_paused_reason or "paused") if org.whatsapp_paused_at else ""


def sending_paused(*, campaign: Campaign) -> str:
    """Why the campaign's sending waits, or "" when it does not: the organization's sending on the
    campaign's channel is paused (organization_paused), or some of its queued messages go from a
    WhatsApp number Meta refused (each named, with Meta's reason; only those messages wait)."""
    org = campaign.organization
    held = organization_paused(campaign=campaign)
    if held or campaign.channel == Channel.EMAIL:
        return held
    paused = dict(
        WhatsappNumber.objects.filter(organization_id=org.pk, paused_at__isnull=False).values_list(
            "pk", "display_phone_number"
        )
    )
    if not paused:
        return ""
    waiting = set(
        WhatsappMessage.objects.filter(
            campaign_id=campaign.pk, status=WhatsappMessage.Status.QUEUED, whatsapp_number_id__in=list(paused)
        )
        .values_list("whatsapp_number_id", flat=True)
        .distinct()
    )
    if (
        campaign.whatsapp_number_id in paused
        and WhatsappMessage.objects.filter(
            campaign_id=campaign.pk, status=WhatsappMessage.Status.QUEUED, whatsapp_number_id__isnull=True
        ).exists()
    ):
        waiting.add(campaign.whatsapp_number_id)
    reasons = (
        WhatsappNumber.objects.filter(pk__in=waiting)
        .order_by("pk")
        .values_list("display_phone_number", "paused_reason")
    )
    return "; ".join(f"{phone}: {reason or 'paused'}" for phone, reason in reasons)


def campaign_status(*, campaign: Campaign) -> dict[str, Any]:
    """What `campaign_status --json` and the progress page show."""
    counts = campaign_counts(campaign_id=campaign.pk, channel=campaign.channel)
    metric = CampaignMetric.objects.filter(campaign_id=campaign.pk).first()
    done = sum(counts[k] for k in COUNT_KEYS if k not in ("queued", "sending"))
    total = sum(counts.values())
    for key in ENGAGEMENT_KEYS:
        counts[key] = getattr(metric, key) if metric else 0
    now = timezone.now()
    window = now - timedelta(seconds=60)
    recent = campaign.message_model.objects.filter(campaign_id=campaign.pk, sent_at__gte=window).count()
    elapsed = (
        (min(now, campaign.finished_at or now) - campaign.started_at).total_seconds()
        if campaign.started_at
        else 0.0
    )
    sent_total = counts["sent"] + counts["delivered"] + counts["read"]
    if campaign.status == Campaign.Status.SENDING:
        rate = recent / max(min(60.0, elapsed), 1.0)
    else:
        rate = sent_total / elapsed if elapsed else 0.0
    remaining = counts["queued"] + counts["sending"]
    revenue, conversions = campaign_revenue(campaign_id=campaign.pk)
    org = campaign.organization
    currency = metric.cost_currency if metric else whatsapp_price_currency()
    estimate = cost_estimate(
        metric.cost if metric else Decimal("0"),
        currency,
        rate=org.cost_conversion_rate,
        rate_currency=org.cost_conversion_currency,
    )
    return {
        "id": campaign.pk,
        "name": campaign.name,
        "channel": campaign.channel,
        "status": campaign.status,
        "status_label": str(Campaign.Status(campaign.status).label),
        "counts": counts,
        "total": total,
        # Processed (settled one way or another) is not sent: a campaign that skipped everyone is
        # fully processed with nothing sent.
        "progress": round(done / total, 4) if total else 0.0,
        "processed": done,
        "reached": metric.sent if metric else sent_total,  # cumulative: a read message was sent
        "cost": str(metric.cost if metric else 0),
        # ISO 4217 of "cost": WhatsApp costs are in the rate card's currency (usually USD), never reais
        # by assumption.
        "cost_currency": currency,
        "cost_display": format_cost(
            metric.cost if metric else 0,
            currency,
            rate=org.cost_conversion_rate,
            rate_currency=org.cost_conversion_currency,
        ),
        # The cost in reais at the organization's rate (None without one): labelled an estimate.
        "cost_estimate": None if estimate is None else str(estimate.quantize(Decimal("0.01"))),
        "rate": round(rate, 2),
        "eta_seconds": round(remaining / rate) if rate and remaining else None,
        "stop_reason": campaign.stop_reason,
        "sending_paused": sending_paused(campaign=campaign),
        # Attributed sales (campaigns.attribution): their total as a decimal string, and how many.
        "revenue": str(revenue.quantize(Decimal("0.01"))),
        "conversions": conversions,
        # The lift report against the control group (campaigns.lift); None without one.
        "lift": lift.campaign_lift(campaign=campaign),
        # Recipients who wrote back within the attribution window after their message.
        "replies": campaign_replies(campaign_id=campaign.pk),
    }


def campaign_replies(*, campaign_id: int) -> int:
    """Recipients of the campaign who wrote back within the attribution window after their message
    (each inbound is tied to the campaign message it answers when it is stored): one index range."""
    return (
        ConversationMessage.objects.filter(
            campaign_id=campaign_id, direction=ConversationMessage.Direction.INBOUND
        )
        .values("customer_id")
        .distinct()
        .count()
    )


def campaign_latest_replies(*, campaign_id: int, limit: int = 10) -> list[ConversationMessage]:
    """The campaign's latest replies, newest first, with their customers."""
    return list(
        ConversationMessage.objects.filter(
            campaign_id=campaign_id, direction=ConversationMessage.Direction.INBOUND
        )
        .select_related("customer")
        .order_by("-at", "-id")[:limit]
    )
