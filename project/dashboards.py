"""The organization's dashboard: its last 30 days of campaigns (revenue by campaign and by store,
sends per day, cost by currency) and NPS, in its time zone. A page that combines apps (campaigns,
surveys), so it lives in the composition layer; it is the admin's home page for a member of one
organization (project.admin_home) and the organization's "Last 30 days" page."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.db.models import Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from campaigns.dashboards import CampaignRow, StoreReplies, StoreRevenue, replies_by_store, revenue_by_store
from campaigns.models import Campaign, CampaignMetric, Channel
from crm.models import Organization
from surveys.selectors import NpsRow, nps_by_store_and_month

DASHBOARD_DAYS = 30
DASHBOARD_MAX_CAMPAIGNS = 200


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
    """The organization's last DASHBOARD_DAYS days in its time zone: six queries, none over messages
    or sales (the replies' over the inbound messages' (organization, at) index)."""
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
