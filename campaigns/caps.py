"""The organization's contact caps, one rule in SQL for the fan-out and for the send batches.

A customer gets at most `message_limit_count` campaign messages in `message_limit_days`, and,
with `block_multiple_campaigns`, no message of a second campaign within 24 hours of another
one's, nor while another campaign's message to them is being sent or waits in a campaign that
started first (so of two campaigns started together the older one wins). With the
organization's `contact_caps_scope` "shared" both channels count together (an email after a
WhatsApp message is the second contact); with "per_channel" each channel counts its own.

The rule is an SQL expression over a customer id column, so the fan-out applies it inside its
INSERT … SELECT (a capped recipient is written SKIPPED with the reason, in the same statement)
and a send batch applies it again to what it claimed (time has passed: other campaigns may have
sent meanwhile). Each message table is probed on its (customer, sent_at) index: one range for
the recent sends, one for the rows not sent yet (sent_at NULL sorts last in that index).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

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
_LABELS: dict[str, str] = {Channel.WHATSAPP: "WhatsApp", Channel.EMAIL: "email"}

# Skip reason of a customer without a recorded marketing consent (crm.models.ConsentSource).
NO_CONSENT = "no consent"
SENT_WITHIN_24H = "sent another campaign within 24 h"
BEING_SENT = "another campaign is being sent to this customer right now"
QUEUED_EARLIER = "waiting in a campaign that started earlier"


def channels_counted(*, organization: Organization, channel: str) -> tuple[str, ...]:
    """The channels whose messages count toward the caps of a campaign on `channel`."""
    if organization.contact_caps_scope == Organization.ContactCapsScope.PER_CHANNEL:
        return (channel,)
    return (Channel.WHATSAPP, Channel.EMAIL)


@dataclass
class _Sql:
    parts: list[str] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)

    def add(self, sql: str, *params: Any) -> None:
        self.parts.append(sql)
        self.params.extend(params)


def skip_reason_sql(*, campaign: Campaign, customer: str, now: datetime) -> tuple[str, list[Any]]:
    """An SQL expression (and its parameters) giving, for the customer id in column `customer`,
    why the organization's caps skip the campaign's message to them, or NULL when none does.
    The campaign's own messages never count."""
    org = campaign.organization
    counted = channels_counted(organization=org, channel=campaign.channel)
    since = now - timedelta(days=org.message_limit_days)
    what = " and ".join(_LABELS[c] for c in counted)
    reason = (
        f"message limit: %s {what} messages in the last {org.message_limit_days} days "
        f"(at most {org.message_limit_count})"
    )
    sql = _Sql()
    # The limit: one index range per channel (customer, sent_at >= the window's start).
    recent = " UNION ALL ".join(
        f"SELECT 1 FROM {_TABLES[c]} m WHERE m.customer_id = {customer} AND m.sent_at >= %s "  # noqa: S608
        f"AND m.campaign_id <> %s AND m.status IN ({', '.join(['%s'] * len(_REACHED[c]))})"
        for c in counted
    )
    recent_params: list[Any] = []
    for c in counted:
        recent_params += [since, campaign.pk, *_REACHED[c]]
    sql.add("COALESCE((SELECT format(%s, count(*)) FROM (", reason)
    sql.add(recent, *recent_params)
    sql.add(") AS recent HAVING count(*) >= %s)", org.message_limit_count)
    if org.block_multiple_campaigns:
        day_ago = now - BLOCK_WINDOW
        started = campaign.started_at or now
        within = " OR ".join(
            f"EXISTS (SELECT 1 FROM {_TABLES[c]} m WHERE m.customer_id = {customer} "  # noqa: S608
            "AND m.sent_at >= %s AND m.campaign_id <> %s)"
            for c in counted
        )
        sql.add(f", CASE WHEN {within} THEN %s END", *(day_ago, campaign.pk) * len(counted), SENT_WITHIN_24H)
        # Messages not sent yet have sent_at NULL, the end of the customer's range in the same index
        # (the status IN keeps the planner off the status index: queued rows are many).
        waiting = " UNION ALL ".join(
            f"SELECT m.status, m.campaign_id FROM {_TABLES[c]} m WHERE m.customer_id = {customer} "  # noqa: S608
            "AND m.sent_at IS NULL AND m.status IN ('queued', 'sending') AND m.campaign_id <> %s"
            for c in counted
        )
        sql.add(
            ", (SELECT CASE WHEN bool_or(w.status = 'sending') THEN %s "  # noqa: S608
            "WHEN bool_or(w.status = 'queued' AND (other.started_at, other.id) < (%s, %s)) THEN %s END "
            f"FROM ({waiting}) AS w JOIN {Campaign._meta.db_table} other ON other.id = w.campaign_id)",
            BEING_SENT,
            started,
            campaign.pk,
            QUEUED_EARLIER,
            *[campaign.pk] * len(counted),
        )
    sql.add(")")
    return "".join(sql.parts), sql.params


def skip_reasons(*, campaign: Campaign, customer_ids: list[int], now: datetime) -> dict[int, str]:
    """The customers among `customer_ids` the caps skip, with the reason: one query."""
    if not customer_ids:
        return {}
    reason, params = skip_reason_sql(campaign=campaign, customer="given.id", now=now)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, reason FROM (SELECT given.id, {reason} AS reason "  # noqa: S608
            "FROM unnest(%s::bigint[]) AS given(id)) AS capped WHERE reason IS NOT NULL",
            [*params, list(customer_ids)],
        )
        return dict(cursor.fetchall())
