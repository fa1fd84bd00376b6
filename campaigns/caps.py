"""The organization's contact caps, one rule for the fan-out and for the send batches.

A customer gets at most `message_limit_count` campaign messages in `message_limit_days`, and,
with `block_multiple_campaigns`, no message of a second campaign within 24 hours of another
one's, nor while another campaign's message to them is being sent or waits in a campaign that
started first and may still send it, sending or paused (so of two campaigns started together the
older one wins; a message left queued in one that ended blocks nobody). With the
organization's `contact_caps_scope` "shared" both channels count together (an email after a
WhatsApp message is the second contact); with "per_channel" each channel counts its own.

`skip_reasons` checks a whole page or batch of customers with one statement, a separate one
from the fan-out's INSERT and the batch's claim: for each customer, per message table counted,
two probes of the table's (customer, sent_at) index (the window's sends; the rows not sent yet,
sent_at NULL, the end of each customer's range in that index), aggregated per customer. The
fan-out applies it to each page before its INSERT (a capped recipient is written SKIPPED with
the reason) and a send batch again to what it claimed (time has passed: other campaigns may
have sent meanwhile).

Plan-stable: the statement runs with sequential and bitmap scans, hash and merge joins off (for
it alone), so each customer is one pair of index probes whatever the planner's
statistics say. With stale or missing statistics (a fresh database; a table a fan-out has just
filled) PostgreSQL otherwise took the customers as most of the table and read it whole, or a
whole other index, once per page or batch (docs/benchmarks.md, "Contact caps").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils.translation import gettext, gettext_noop

from campaigns.models import Campaign, Channel, EmailMessage, WhatsappMessage
from crm.models import Organization

BLOCK_WINDOW = timedelta(hours=24)

# What counts as a contact: a message the provider accepted (not one that bounced or failed).
_REACHED: dict[str, tuple[str, ...]] = {
    Channel.WHATSAPP: (
        WhatsappMessage.Status.SENT,
        WhatsappMessage.Status.DELIVERED,
        WhatsappMessage.Status.READ,
    ),
    Channel.EMAIL: (EmailMessage.Status.SENT,),
}
_TABLES: dict[str, str] = {
    Channel.WHATSAPP: WhatsappMessage._meta.db_table,
    Channel.EMAIL: EmailMessage._meta.db_table,
}
_MODELS: dict[str, type[WhatsappMessage] | type[EmailMessage]] = {
    Channel.WHATSAPP: WhatsappMessage,
    Channel.EMAIL: EmailMessage,
}
_LABELS: dict[str, str] = {Channel.WHATSAPP: "WhatsApp", Channel.EMAIL: "email"}
# The caps' statement reads the message tables with index probes of their (customer, sent_at)
# index: sequential and bitmap scans, hash and merge joins off, so each customer is its probes.
# Those settings do not choose between indexes, so the probes are written so that no other index
# can serve them, by construction rather than by costs: no clause names sent_at or status on its
# own (the window is the row comparison (customer_id, sent_at) >= (customer, since), which no
# other index's columns match and which, unlike `sent_at >= …`, does not imply the partial
# (campaign, sent_at) index's predicate `sent_at IS NOT NULL`; the not-sent probe's statuses are
# told apart in the aggregate), and `campaign_id <> …`, `status <> …` are no index conditions.
# Before, on an empty table just analyzed (a fresh database), the window's probe read the whole
# partial (campaign, sent_at) index and the not-sent one skip-scanned (campaign, status, id). The
# one other index left is the unique (campaign, customer): `customer_id = …` matches its second
# column (a skip scan over the campaigns); only a table with no page at all had it picked, where
# every probe reads nothing (tests/campaigns/test_caps_plan.py; docs/benchmarks.md, "Contact
# caps"). Set for that statement alone, in the same round trip (several statements in one;
# PostgreSQL runs them in one transaction when no other is open, and RESET puts the caller's
# settings back when one is).
_PLANNER = ("enable_seqscan", "enable_bitmapscan", "enable_hashjoin", "enable_mergejoin")
PLAN_STABLE = "".join(f"SET LOCAL {name} = off; " for name in _PLANNER)
PLAN_RESET = "".join(f"; RESET {name}" for name in _PLANNER)

# Skip reason of a customer without a recorded marketing consent (crm.models.ConsentSource).
# Stored in English (the message's error_reason); shown translated by skip_reason_label.
NO_CONSENT = gettext_noop("no consent")
SENT_WITHIN_24H = gettext_noop("sent another campaign within 24 h")
BEING_SENT = gettext_noop("another campaign is being sent to this customer right now")
QUEUED_EARLIER = gettext_noop("waiting in a campaign that started earlier")
_LIMIT_RE = re.compile(r"^message limit: (\d+) (.+) messages in the last (\d+) days \(at most (\d+)\)$")


def skip_reason_label(reason: str) -> str:
    """A stored skip reason in the active language (an unknown one as stored)."""
    limit = _LIMIT_RE.match(reason or "")
    if limit:
        recent, what, days, most = limit.groups()
        return gettext(
            "message limit: %(recent)s %(what)s messages in the last %(days)s days (at most %(most)s)"
        ) % {
            "recent": recent,
            "what": what.replace(" and ", gettext(" and ")),
            "days": days,
            "most": most,
        }
    if reason in (NO_CONSENT, SENT_WITHIN_24H, BEING_SENT, QUEUED_EARLIER):
        return gettext(reason)
    return reason


def reason_kind(reason: str) -> str:
    """What kind of cap a skip_reasons reason is: "another_campaign" (the 24-hour block between
    campaigns) or "contact_cap" (the message limit)."""
    return "another_campaign" if reason in (SENT_WITHIN_24H, BEING_SENT, QUEUED_EARLIER) else "contact_cap"


def channels_counted(*, organization: Organization, channel: str) -> tuple[str, ...]:
    """The channels whose messages count toward the caps of a campaign on `channel`."""
    if organization.contact_caps_scope == Organization.ContactCapsScope.PER_CHANNEL:
        return (channel,)
    return (Channel.WHATSAPP, Channel.EMAIL)


def with_history(*, campaign: Campaign, customers: QuerySet, now: datetime) -> QuerySet:
    """`customers` narrowed to those the caps could skip: with a message of another campaign counted
    in the window (or, with the block, not sent yet). One semi-join per message table, in SQL; the
    others have no history, so skip_reasons would pass them."""
    org = campaign.organization
    since = now - timedelta(days=org.message_limit_days)
    if org.block_multiple_campaigns:
        since = min(since, now - BLOCK_WINDOW)
    history = Q()
    for c in channels_counted(organization=org, channel=campaign.channel):
        model = _MODELS[c]
        mine = model.objects.filter(customer_id=OuterRef("pk")).exclude(campaign_id=campaign.pk)
        history |= Q(Exists(mine.filter(sent_at__gte=since)))
        if org.block_multiple_campaigns:
            history |= Q(Exists(mine.filter(sent_at__isnull=True, status__in=("queued", "sending"))))
    return customers.filter(history)


def history_sql(*, campaign: Campaign, customer_ids: list[int], now: datetime) -> tuple[str, list[Any]]:
    """The caps' aggregate (SQL and its parameters): per customer among `customer_ids` with some
    history, (customer id, messages that reached them in the window, whether one was sent within
    24 h, whether one is being sent, whether one waits in a campaign started earlier). The
    campaign's own messages never count."""
    org = campaign.organization
    block = org.block_multiple_campaigns
    since = now - timedelta(days=org.message_limit_days)
    day_ago = now - BLOCK_WINDOW
    parts: list[str] = []
    params: list[Any] = []
    for c in channels_counted(organization=org, channel=campaign.channel):
        reached = ", ".join(["%s"] * len(_REACHED[c]))
        parts.append(
            f"SELECT m.campaign_id, m.status, m.sent_at, m.status IN ({reached}) AS reached "  # noqa: S608
            f"FROM {_TABLES[c]} m WHERE m.customer_id = given.id "
            "AND (m.customer_id, m.sent_at) >= (given.id, %s) "
            # A control group's row (campaigns.lift) has a would-be send time: not a contact.
            "AND m.campaign_id <> %s AND m.status <> 'held_out'"
        )
        # The block's 24 hours lie within the limit's window (message_limit_days is 1 or more).
        params += [*_REACHED[c], min(since, day_ago) if block else since, campaign.pk]
        if block:
            # Not sent yet: sent_at NULL, the end of each customer's range in the same index (queued
            # or sending told apart in the aggregate: a status here would be an index condition of
            # (campaign, status, id)).
            parts.append(
                "SELECT m.campaign_id, m.status, m.sent_at, false "  # noqa: S608
                f"FROM {_TABLES[c]} m WHERE m.customer_id = given.id AND m.sent_at IS NULL "
                "AND m.campaign_id <> %s"
            )
            params.append(campaign.pk)
    # Whether a queued message waits in a campaign that started first and will send it (sending or
    # paused; one that ended never sends what it left queued): the organization's few such campaigns
    # read once for the statement (an InitPlan), not a join whose method the costs would choose (as
    # fast as the probe of the campaign's key per message it replaced: 130-240 ms for 20,000
    # customers that all have one).
    sql = (
        "SELECT given.id, count(*) FILTER (WHERE h.reached AND h.sent_at >= %s), "  # noqa: S608
        "coalesce(bool_or(h.sent_at >= %s), false), "
        "coalesce(bool_or(h.status = 'sending' AND h.sent_at IS NULL), false), "
        "coalesce(bool_or(h.status = 'queued' AND h.sent_at IS NULL AND h.campaign_id = ANY(ARRAY("
        f"SELECT other.id FROM {Campaign._meta.db_table} other WHERE other.organization_id = %s "
        "AND other.status IN (%s, %s) AND (other.started_at, other.id) < (%s, %s)))), false) "
        f"FROM unnest(%s::bigint[]) AS given(id) CROSS JOIN LATERAL ({' UNION ALL '.join(parts)}) AS h "
        "GROUP BY given.id"
    )
    live = (Campaign.Status.SENDING, Campaign.Status.PAUSED)
    started = campaign.started_at or now
    return sql, [since, day_ago, org.pk, *live, started, campaign.pk, customer_ids, *params]


def _results(cursor: Any) -> list[tuple]:
    """The rows of the one statement of several run at once that returns some."""
    rows: list[tuple] = []
    while True:
        if cursor.description is not None:
            rows = cursor.fetchall()
        if not cursor.nextset():
            return rows


def skip_reasons(*, campaign: Campaign, customer_ids: Sequence[int], now: datetime) -> dict[int, str]:
    """The customers among `customer_ids` the caps skip, with the reason: one statement, whose
    cost is bounded by those customers' recent messages whatever the tables' size or statistics."""
    if not customer_ids or campaign.caps_exempt:
        return {}
    org = campaign.organization
    sql, params = history_sql(campaign=campaign, customer_ids=sorted(set(customer_ids)), now=now)
    with connection.cursor() as cursor:
        cursor.execute(PLAN_STABLE + sql + PLAN_RESET, params)
        rows = _results(cursor)
    counted = channels_counted(organization=org, channel=campaign.channel)
    what = " and ".join(_LABELS[c] for c in counted)
    reasons: dict[int, str] = {}
    for customer_id, recent, within, sending, earlier in rows:
        if recent >= org.message_limit_count:
            reasons[customer_id] = (
                f"message limit: {recent} {what} messages in the last {org.message_limit_days} days "
                f"(at most {org.message_limit_count})"
            )
        elif not org.block_multiple_campaigns:
            continue
        elif within:
            reasons[customer_id] = SENT_WITHIN_24H
        elif sending:
            reasons[customer_id] = BEING_SENT
        elif earlier:
            reasons[customer_id] = QUEUED_EARLIER
    return reasons
