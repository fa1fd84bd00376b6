"""Incrementality: a campaign's control group and the lift report (docs/analytics.md).

A campaign with `control_percent` holds out that share of its recipients at random, after
consent, opt-outs and the contact caps (the fan-out, campaigns.fanout): each one is a message
row with status `held_out`, never sent, whose `sent_at` is set when its batch is sent (or when the
campaign completes), so both arms' purchase windows start together.

The report compares the arms over the channel's attribution window after the send (or the
would-be send): the treatment arm is every message sent (intention to treat: a message read or
not, delivered or failed later), the control arm every held-out one. Its figures come from
`LiftSale`, kept as sales are written (the "sales written" hook, `sales_written` below): a sale of
a customer with such a message in the window before it is written once per campaign and arm, in
the statement that sees the sale, and a sale that no longer qualifies (its customer or time
changed) is removed. The report is then two aggregates over one campaign: its messages' arms (the
(campaign, sent_at) index) and its window's sales per customer (the liftsale_report index, only
the campaign's buyers' sales) — never the sales table. Statistics: crm.liftstats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from campaigns import caps
from campaigns.models import Campaign, Channel, EmailMessage, WhatsappMessage
from crm import hooks, liftstats
from crm.models import Customer, Organization, Sale

HELD_OUT = WhatsappMessage.Status.HELD_OUT
_TABLES = {Channel.WHATSAPP: WhatsappMessage._meta.db_table, Channel.EMAIL: EmailMessage._meta.db_table}


def window_sql(channel: str, org_alias: str = "o") -> str:
    """The attribution window of `channel` as an SQL interval over the organization `org_alias`."""
    return (
        f"make_interval(days => coalesce({org_alias}.attribution_window_{channel}_days, "
        f"{org_alias}.attribution_window_days))"
    )


def window_days(*, organization: Organization, channel: str) -> int:
    own = getattr(organization, f"attribution_window_{channel}_days", None)
    return int(own or organization.attribution_window_days)


# --- The control arm --------------------------------------------------------------------------


def held_out_stamp(
    *, model: type[WhatsappMessage] | type[EmailMessage], campaign_id: int, batch: int | None
) -> int:
    """Give the held-out messages of a batch (all the campaign's with None) that have none the
    time they would have been sent: now. Called as the batch's treatment messages are claimed.
    Returns how many; safe to run twice."""
    rows = model.objects.filter(campaign_id=campaign_id, status=HELD_OUT, sent_at__isnull=True)
    if batch is not None:
        rows = rows.filter(batch=batch)
    return rows.update(sent_at=timezone.now())


def held_out_record(*, campaign: Campaign, customer_id: int, at: datetime | None = None) -> bool:
    """Record one customer of `campaign` as held out (a `held_out` message row, would-be send time
    `at`, nothing sent): for a path that decides one customer at a time (a flow's split branch).
    Returns whether it was recorded (False when the customer has a message of it already)."""
    model = campaign.message_model
    with transaction.atomic():
        _, created = model.objects.get_or_create(
            campaign_id=campaign.pk,
            customer_id=customer_id,
            defaults={
                "organization_id": campaign.organization_id,
                "status": HELD_OUT,
                "sent_at": at or timezone.now(),
            },
        )
    return created


def held_out_skip_reason(*, campaign: Campaign, customer: Customer, now: datetime | None = None) -> str:
    """Why a customer held out one at a time (a flow's split) would not have been sent, or "":
    the send pipeline's own checks at the would-be send time (consent, the channel's opt-out, the
    contact caps), so the control arm leaves out whom the treatment arm's sends skip."""
    if not customer.marketing_consent:
        return caps.NO_CONSENT
    reachable = (
        customer.can_receive_email if campaign.channel == Channel.EMAIL else customer.can_receive_whatsapp
    )
    if not reachable:
        return "customer opted out or has no address"
    capped = caps.skip_reasons(campaign=campaign, customer_ids=[customer.pk], now=now or timezone.now())
    return capped.get(customer.pk, "")


# --- The rollup, as sales are written ---------------------------------------------------------

# The messages of one table in the window before the sale, of campaigns with a control group: sent
# (any outcome since) or held out with their would-be send time.
_WINDOW_SQL = """SELECT m.campaign_id, m.status = 'held_out' AS control
             FROM {table} m
             WHERE m.customer_id = s.customer_id
               AND m.sent_at <= s.sold_at
               AND m.sent_at >= s.sold_at - {window}"""

_LIFT_SQL = """
WITH s AS (
    SELECT s.id, s.customer_id, s.total, s.sold_at
    FROM crm_sale s
    WHERE s.organization_id = %(org)s AND s.id = ANY(%(ids)s) AND s.customer_id IS NOT NULL
      AND s.sold_at <= now() + make_interval(secs => %(future_tolerance)s)
),
hits AS (
    SELECT DISTINCT ON (touch.campaign_id, s.id) touch.campaign_id, s.id AS sale_id, s.customer_id,
           touch.control, s.total
    FROM s CROSS JOIN (SELECT * FROM crm_organization WHERE id = %(org)s) o
    JOIN LATERAL ({whatsapp} UNION ALL {email}) touch ON true
    JOIN campaigns_campaign c ON c.id = touch.campaign_id AND c.control_percent > 0
    ORDER BY touch.campaign_id, s.id
),
removed AS (
    DELETE FROM campaigns_liftsale l
    WHERE l.sale_id = ANY(%(ids)s)
      AND NOT EXISTS (SELECT 1 FROM hits h WHERE h.campaign_id = l.campaign_id AND h.sale_id = l.sale_id)
    RETURNING 1
),
written AS (
    INSERT INTO campaigns_liftsale AS l (campaign_id, sale_id, customer_id, control, total)
    SELECT campaign_id, sale_id, customer_id, control, total FROM hits ORDER BY campaign_id, sale_id
    ON CONFLICT (campaign_id, sale_id) DO UPDATE SET
        customer_id = EXCLUDED.customer_id, control = EXCLUDED.control, total = EXCLUDED.total
    WHERE (l.customer_id, l.control, l.total) IS DISTINCT FROM
          (EXCLUDED.customer_id, EXCLUDED.control, EXCLUDED.total)
    RETURNING 1
)
SELECT (SELECT count(*) FROM hits), (SELECT count(*) FROM written), (SELECT count(*) FROM removed)
"""


def _lift_sql() -> str:
    parts = {
        channel: _WINDOW_SQL.format(table=table, window=window_sql(channel))
        for channel, table in _TABLES.items()
    }
    return _LIFT_SQL.format(whatsapp=parts[Channel.WHATSAPP], email=parts[Channel.EMAIL])


def sales_lift(*, organization_id: int, sale_ids: list[int]) -> int:
    """Write these sales of one organization into the lift rollup of every campaign with a control
    group whose message (sent or held out) their customer had in the window before them, and take
    out the ones that no longer qualify: one statement. Returns how many (campaign, sale) pairs
    count. Safe to run twice."""
    if not sale_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            _lift_sql(),
            {
                "org": organization_id,
                "ids": list(sale_ids),
                "future_tolerance": settings.SALE_FUTURE_TOLERANCE_SECONDS,
            },
        )
        hits, _, _ = cursor.fetchone()
    return int(hits)


def sales_written(event: hooks.SalesWritten) -> int:
    """The "sales written" hook: keep the lift rollups of those sales current."""
    return sales_lift(organization_id=event.organization_id, sale_ids=list(event.sale_ids))


def campaign_lift_rebuild(*, campaign: Campaign, page: int = 20_000) -> int:
    """Evaluate again every sale that may fall in the campaign's windows (after a change of the
    window, or for a campaign whose control group was recorded after its sales): the sales of its
    messages' customers since its first send, by pages of customers. Returns the pairs counted."""
    model = campaign.message_model
    first = model.objects.filter(campaign_id=campaign.pk, sent_at__isnull=False).order_by("sent_at")
    start = first.values_list("sent_at", flat=True).first()
    if start is None:
        return 0
    customers = model.objects.filter(campaign_id=campaign.pk, sent_at__isnull=False).order_by("customer_id")
    counted, after = 0, 0
    while True:
        ids = list(customers.filter(customer_id__gt=after).values_list("customer_id", flat=True)[:page])
        if not ids:
            return counted
        sale_ids = list(
            Sale.objects.filter(customer_id__in=ids, sold_at__gte=start).values_list("pk", flat=True)
        )
        with transaction.atomic():
            counted += sales_lift(organization_id=campaign.organization_id, sale_ids=sale_ids)
        after = ids[-1]


# --- The report -------------------------------------------------------------------------------

_ARMS_SQL = (
    "SELECT count(*) FILTER (WHERE status <> 'held_out'), count(*) FILTER (WHERE status = 'held_out') "
    "FROM {table} WHERE campaign_id = %s AND sent_at IS NOT NULL"
)
_BUYERS_SQL = (
    "SELECT control, count(*), coalesce(sum(revenue), 0), coalesce(sum(revenue * revenue), 0) "
    "FROM (SELECT control, customer_id, sum(total) AS revenue FROM campaigns_liftsale "
    "WHERE campaign_id = %s GROUP BY control, customer_id) AS per_customer GROUP BY control"
)
# Several campaigns pooled (a flow's step campaigns): a customer counts once per arm, a sale once
# per arm however many of the campaigns' windows it falls in.
_POOLED_ARMS_SQL = (
    "SELECT count(DISTINCT customer_id) FILTER (WHERE status <> 'held_out'), "
    "count(DISTINCT customer_id) FILTER (WHERE status = 'held_out') FROM ("
    "SELECT customer_id, status FROM {whatsapp} WHERE campaign_id = ANY(%(ids)s) AND sent_at IS NOT NULL "
    "UNION ALL "
    "SELECT customer_id, status FROM {email} WHERE campaign_id = ANY(%(ids)s) AND sent_at IS NOT NULL) AS m"
)
_POOLED_BUYERS_SQL = (
    "SELECT control, count(*), coalesce(sum(revenue), 0), coalesce(sum(revenue * revenue), 0) "
    "FROM (SELECT control, customer_id, sum(total) AS revenue FROM (SELECT DISTINCT control, customer_id, "
    "sale_id, total FROM campaigns_liftsale WHERE campaign_id = ANY(%(ids)s)) AS sales "
    "GROUP BY control, customer_id) AS per_customer GROUP BY control"
)


@dataclass(frozen=True)
class ArmFigures:
    customers: int
    buyers: int
    revenue: Decimal
    revenue_squares: Decimal

    def stats(self) -> liftstats.Arm:
        return liftstats.Arm(self.customers, self.buyers, float(self.revenue), float(self.revenue_squares))


def _arms(cursor: Any, treated: int, held: int) -> tuple[ArmFigures, ArmFigures]:
    rows = {control: row for control, *row in cursor.fetchall()}
    zero = (0, Decimal("0"), Decimal("0"))
    t, c = rows.get(False, zero), rows.get(True, zero)
    return ArmFigures(treated, t[0], t[1], t[2]), ArmFigures(held, c[0], c[1], c[2])


def campaign_arms(*, campaign: Campaign) -> tuple[ArmFigures, ArmFigures]:
    """(treatment, control) of a campaign: two aggregates over that campaign alone."""
    with connection.cursor() as cursor:
        cursor.execute(_ARMS_SQL.format(table=_TABLES[Channel(campaign.channel)]), [campaign.pk])
        treated, held = cursor.fetchone()
        cursor.execute(_BUYERS_SQL, [campaign.pk])
        return _arms(cursor, treated, held)


def pooled_arms(*, campaign_ids: list[int]) -> tuple[ArmFigures, ArmFigures]:
    """(treatment, control) of several campaigns as one experiment (a flow's step campaigns, of
    either channel): the same two aggregates over those campaigns, each customer and each sale
    counted once per arm."""
    with connection.cursor() as cursor:
        tables = {"whatsapp": _TABLES[Channel.WHATSAPP], "email": _TABLES[Channel.EMAIL]}
        cursor.execute(_POOLED_ARMS_SQL.format(**tables), {"ids": list(campaign_ids)})
        treated, held = cursor.fetchone()
        cursor.execute(_POOLED_BUYERS_SQL, {"ids": list(campaign_ids)})
        return _arms(cursor, treated, held)


def _money(value: float | Decimal) -> str:
    return str(Decimal(str(value)).quantize(Decimal("0.01")))


def _rounded(value: float | None, places: int = 6) -> float | None:
    """Rounded; None for nothing or for a bound without limit (JSON has no infinity: an interval's
    upper end is null when an empty control group leaves it open)."""
    return None if value is None or math.isinf(value) else round(value, places)


def lift_report(*, treatment: ArmFigures, control: ArmFigures, window_days: int) -> dict[str, Any]:
    """The lift report of two arms, the shape `campaign_status --json` and `flows status --json`
    give under "lift". Counts are integers, money decimal strings, lifts relative (0.25 = +25%)."""
    rate = liftstats.buyers_rate_lift(treatment.stats(), control.stats())
    revenue = liftstats.revenue_lift(treatment.stats(), control.stats())
    per_customer = revenue.difference if revenue else 0.0
    control_mean = control.stats().mean
    return {
        "treatment": {
            "customers": treatment.customers,
            "buyers": treatment.buyers,
            "revenue": _money(treatment.revenue),
        },
        "control": {
            "customers": control.customers,
            "buyers": control.buyers,
            "revenue": _money(control.revenue),
        },
        "buyers_rate_lift": _rounded(rate.lift) if rate else None,
        "buyers_rate_lift_ci95": [_rounded(rate.ci95[0]), _rounded(rate.ci95[1])] if rate else None,
        "p_value": _rounded(rate.p_value) if rate else None,
        "incremental_revenue": _money(per_customer * treatment.customers),
        "significant": bool(rate and rate.significant),
        "revenue_per_customer_lift": _money(per_customer),
        "revenue_per_customer_lift_ci95": [_money(revenue.ci95[0]), _money(revenue.ci95[1])]
        if revenue
        else None,
        "revenue_per_customer_relative_lift": _rounded(per_customer / control_mean) if control_mean else None,
        "revenue_p_value": _rounded(revenue.p_value) if revenue else None,
        "window_days": window_days,
    }


def campaign_lift(*, campaign: Campaign) -> dict[str, Any] | None:
    """The lift report as `campaign_status --json` gives it under "lift"; None without a control
    group."""
    if not campaign.control_percent:
        return None
    treatment, control = campaign_arms(campaign=campaign)
    return lift_report(
        treatment=treatment,
        control=control,
        window_days=window_days(organization=campaign.organization, channel=campaign.channel),
    )


def campaigns_lift(*, campaigns: list[Campaign]) -> dict[str, Any] | None:
    """The lift report of several campaigns pooled as one experiment (a flow's step campaigns with
    a control arm); None when none has one. The window is the longest of their channels'."""
    with_control = [c for c in campaigns if c.control_percent]
    if not with_control:
        return None
    if len(with_control) == 1:
        return campaign_lift(campaign=with_control[0])
    treatment, control = pooled_arms(campaign_ids=[c.pk for c in with_control])
    days = max(window_days(organization=c.organization, channel=c.channel) for c in with_control)
    return lift_report(treatment=treatment, control=control, window_days=days)


def base_buyers_rate(
    *, organization: Organization, channel: str, now: datetime | None = None
) -> float | None:
    """The share of the organization's customers who bought within one attribution window (the
    last one): the control rate a campaign's minimum detectable lift is computed for."""
    now = now or timezone.now()
    days = window_days(organization=organization, channel=channel)
    buyers = Sale.objects.filter(
        organization_id=organization.pk, sold_at__gte=now - timedelta(days=days), customer__isnull=False
    ).aggregate(n=Count("customer_id", distinct=True))["n"]
    customers = Customer.objects.filter(organization_id=organization.pk).count()
    return buyers / customers if customers and buyers else None


def campaign_mde(*, campaign: Campaign, audience: int, base_rate: float | None) -> float | None:
    """Before launch: the minimum detectable relative lift of the buyers rate for the campaign's
    split of `audience` recipients (5% two-sided, 80% power); None without a control group."""
    held = audience * campaign.control_percent // 100
    if not held or base_rate is None:
        return None
    return liftstats.minimum_detectable_lift(treatment=audience - held, control=held, base_rate=base_rate)
