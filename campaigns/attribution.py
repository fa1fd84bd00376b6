"""Revenue attribution: which campaign a sale is credited to, kept current as sales arrive.

A sale of a customer who was sent a campaign message (WhatsApp sent, delivered or read; email
sent) at most the organization's attribution window of the message's channel before it
(`attribution_window_whatsapp_days` / `_email_days`, else `attribution_window_days`; with
`attribution_engaged_only`, only a message read or clicked before the sale) — sent_at <= sold_at <=
sent_at + window, both ends included — is attributed to the campaign of the latest such message,
whatever its channel (last touch; on a tie the WhatsApp message, then the higher id). A sale before
every message, or after the window, is not attributed. Each sale has at most one SaleAttribution
row (its primary key), and CampaignRevenue sums them per campaign (database triggers, see
campaigns.models.CampaignRevenue).

Attribution is evaluated when a sale is written — the platform's "sales written" hook
(crm.hooks), which every path that writes sales fires — from the sale's own sold_at, so a sale
the ERP delivers late is credited to the message before it, and a message sent after a sale never
changes it. `manage.py attribute` evaluates every sale of an organization again (after a change of
the window, or of message outcomes settled late), in pages; a repeat writes nothing.

Each evaluation is one statement over a page of sales (``INSERT … SELECT`` with a ``LATERAL``
lookup of the latest message in each message table on its (customer, sent_at) index, ``ON
CONFLICT (sale) DO UPDATE`` only when something changed, and a ``DELETE`` of attributions that no
longer hold), after a transaction-scoped advisory lock on the organization: the statement then
reads every sale and attribution as committed by the evaluation before it, so an evaluation made
from an older copy of a sale can never overwrite one made from a newer copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max, Min

from campaigns.models import EmailMessage, WhatsappMessage
from crm import hooks
from crm.models import Sale

# Messages that reached their customer: sent and not failed, bounced or blocked since.
WHATSAPP_REACHED = (
    WhatsappMessage.Status.SENT,
    WhatsappMessage.Status.DELIVERED,
    WhatsappMessage.Status.READ,
)
EMAIL_REACHED = (EmailMessage.Status.SENT,)
PAGE_IDS = 20_000  # sale ids per statement when a whole organization is evaluated again


@dataclass
class AttributionCounts:
    """What evaluations did: sales looked at, attributed (changed or not), new rows, changed rows,
    rows removed (the sale no longer qualifies), statements."""

    sales: int = 0
    attributed: int = 0
    created: int = 0
    changed: int = 0
    removed: int = 0
    pages: int = 0

    def add(self, other: AttributionCounts) -> None:
        for name in ("sales", "attributed", "created", "changed", "removed", "pages"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


# The latest message of one table that reached the sale's customer within the window before it:
# a backward range scan of the table's (customer, sent_at) index.
_LATEST_SQL = """(SELECT m.campaign_id, '{channel}' AS channel, m.id AS message_id, m.sent_at
             FROM {table} m
             WHERE m.customer_id = s.customer_id
               AND m.sent_at <= s.sold_at
               AND m.sent_at >= s.sold_at - make_interval(days =>
                   coalesce(o.attribution_window_{channel}_days, o.attribution_window_days))
               AND m.status = ANY(%({channel}_reached)s)
               AND (NOT o.attribution_engaged_only OR {engaged})
             ORDER BY m.sent_at DESC, m.id DESC
             LIMIT 1)"""

# Engagement-qualified attribution (Organization.attribution_engaged_only): the customer engaged
# with the message before the sale — a WhatsApp message read or its link clicked, an email clicked.
_ENGAGED = {
    "whatsapp": "(m.read_at <= s.sold_at OR m.clicked_at <= s.sold_at)",
    "email": "(m.clicked_at <= s.sold_at)",
}

# {where} chooses the page's sales, always within one organization (%(org)s).
_ATTRIBUTE_SQL = """
WITH page AS (
    SELECT s.id, s.organization_id, s.store_id, s.total, s.sold_at,
           touch.campaign_id, touch.channel, touch.message_id, touch.sent_at
    FROM crm_sale s
    JOIN crm_organization o ON o.id = s.organization_id
    LEFT JOIN LATERAL (
        SELECT * FROM (
            {whatsapp}
            UNION ALL
            {email}
        ) latest
        ORDER BY latest.sent_at DESC, (latest.channel = 'whatsapp') DESC
        LIMIT 1
    -- A sale stamped in the future (a wrong ERP clock) is never credited: no touch, no attribution.
    ) touch ON s.sold_at <= now() + make_interval(secs => %(future_tolerance)s)
    WHERE s.organization_id = %(org)s AND {where}
),
removed AS (
    -- By primary key whatever the table's size (a join could pick a scan of the whole table).
    DELETE FROM campaigns_saleattribution a
    WHERE a.sale_id = ANY(ARRAY(SELECT id FROM page WHERE campaign_id IS NULL))
    RETURNING a.sale_id
),
written AS (
    INSERT INTO campaigns_saleattribution AS a (
        sale_id, campaign_id, organization_id, store_id, total, sold_at,
        channel, message_id, message_sent_at, attributed_at
    )
    SELECT id, campaign_id, organization_id, store_id, total, sold_at, channel, message_id, sent_at, now()
    FROM page
    WHERE campaign_id IS NOT NULL
    ORDER BY id
    ON CONFLICT (sale_id) DO UPDATE SET
        campaign_id = EXCLUDED.campaign_id,
        organization_id = EXCLUDED.organization_id,
        store_id = EXCLUDED.store_id,
        total = EXCLUDED.total,
        sold_at = EXCLUDED.sold_at,
        channel = EXCLUDED.channel,
        message_id = EXCLUDED.message_id,
        message_sent_at = EXCLUDED.message_sent_at,
        attributed_at = EXCLUDED.attributed_at
    WHERE (a.campaign_id, a.organization_id, a.store_id, a.total, a.sold_at, a.channel, a.message_id,
           a.message_sent_at)
        IS DISTINCT FROM (EXCLUDED.campaign_id, EXCLUDED.organization_id, EXCLUDED.store_id, EXCLUDED.total,
           EXCLUDED.sold_at, EXCLUDED.channel, EXCLUDED.message_id, EXCLUDED.message_sent_at)
    RETURNING (xmax = 0) AS created
)
SELECT (SELECT count(*) FROM page),
       (SELECT count(*) FROM page WHERE campaign_id IS NOT NULL),
       (SELECT count(*) FROM written WHERE created),
       (SELECT count(*) FROM written WHERE NOT created),
       (SELECT count(*) FROM removed)
"""

_BY_ID = "s.id = ANY(%(ids)s)"
_BY_ERP_ID = "s.erp_id = ANY(%(erp_ids)s)"
_BY_RANGE = "s.id >= %(low)s AND s.id < %(high)s"


def _lock(organization_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"attribution:{organization_id}"])


def _evaluate(organization_id: int, where: str, params: dict[str, Any]) -> AttributionCounts:
    # No savepoint inside the caller's transaction (an ERP page): a failure fails the page anyway.
    with transaction.atomic(savepoint=False):
        _lock(organization_id)
        with connection.cursor() as cursor:
            cursor.execute(
                _ATTRIBUTE_SQL.format(
                    where=where,
                    whatsapp=_LATEST_SQL.format(
                        channel="whatsapp", table=WhatsappMessage._meta.db_table, engaged=_ENGAGED["whatsapp"]
                    ),
                    email=_LATEST_SQL.format(
                        channel="email", table=EmailMessage._meta.db_table, engaged=_ENGAGED["email"]
                    ),
                ),
                {
                    "org": organization_id,
                    "whatsapp_reached": list(WHATSAPP_REACHED),
                    "email_reached": list(EMAIL_REACHED),
                    "future_tolerance": settings.SALE_FUTURE_TOLERANCE_SECONDS,
                    **params,
                },
            )
            sales, attributed, created, changed, removed = cursor.fetchone()
    return AttributionCounts(
        sales=sales, attributed=attributed, created=created, changed=changed, removed=removed, pages=1
    )


def sales_attribute(
    *, organization_id: int, sale_ids: Sequence[int] = (), erp_ids: Sequence[str] = ()
) -> AttributionCounts:
    """Evaluate the attribution of these sales of one organization (by id or by ERP id) in one
    statement, inside the caller's transaction when there is one; returns the counts. Safe to run
    twice: an unchanged attribution is not written again."""
    if sale_ids:
        return _evaluate(organization_id, _BY_ID, {"ids": list(sale_ids)})
    if erp_ids:
        return _evaluate(organization_id, _BY_ERP_ID, {"erp_ids": list(erp_ids)})
    return AttributionCounts()


def organization_attribute(
    *,
    organization_id: int,
    since: datetime | None = None,
    page_ids: int = PAGE_IDS,
    expect: Callable[[int], None] | None = None,
    progress: Callable[[AttributionCounts], None] | None = None,
) -> AttributionCounts:
    """Evaluate again every sale of the organization sold at or after `since` (all when None), one
    statement and one transaction per range of `page_ids` sale ids; returns the totals. `expect` is
    told how many sales there are, `progress` each page's counts. Idempotent: a second run writes
    nothing."""
    sales = Sale.objects.filter(organization_id=organization_id)
    where = _BY_RANGE
    if since is not None:
        sales = sales.filter(sold_at__gte=since)
        where += " AND s.sold_at >= %(since)s"
    bounds = sales.aggregate(low=Min("pk"), high=Max("pk"), count=Count("pk"))
    if expect:
        expect(bounds["count"])
    total = AttributionCounts()
    if bounds["low"] is None:
        return total
    for low in range(bounds["low"], bounds["high"] + 1, page_ids):
        page = _evaluate(organization_id, where, {"low": low, "high": low + page_ids, "since": since})
        total.add(page)
        if progress:
            progress(page)
    return total


def sales_written(event: hooks.SalesWritten) -> int:
    """The "sales written" hook: evaluate those sales' attribution; returns how many are credited."""
    return sales_attribute(organization_id=event.organization_id, sale_ids=event.sale_ids).attributed
