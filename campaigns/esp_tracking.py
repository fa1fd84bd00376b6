"""ESP tracking webhooks feeding the statuses that SMTP sends and our own links feed.

The intake (campaigns.esp_views: authenticated, strict JSON, the provider's shape) stores the raw
events in the inbox; a worker's drain (campaigns.inbox) hands anymail's normalized events
(integrations.email.tracking.events) to `events_apply`, which finds their messages by
`event.message_id` = EmailMessage.esp_message_id with one indexed query (within the organization
the webhook URL names, when it names one) and applies each event in order:

delivered: nothing (sending already counted sent and delivered) · bounced, rejected: BOUNCED hard, only
from SENT, metric bounced+1 delivered-1, the address suppressed (a soft bounce, which some ESPs report
as "bounced" too, is only noted; a policy block, SendGrid's "blocked", Mailgun's "espblock" or a
5.7.x reply, is BLOCKED, metric blocked+1 delivered-1, the address kept: integrations.email.bounces) ·
dropped because the address unsubscribed (SendGrid): FAILED with the reason, the customer opted out
of email, the address kept · failed (Brevo's "error"): FAILED with the reason ·
deferred: noted in bounce_message · complained: the address suppressed ("complaint") and the
customer opted out of email · unsubscribed: opted out · opened, clicked: counted once (campaigns.links).

Every transition is a compare-and-set, so an event the ESP posts twice counts once. An event whose id
is not (yet) stored is early: the ESP can report a bounce before the send job has recorded the chunk
that carried the message (a chunk spans seconds at the organization's rate). `events_apply` returns
such events and the inbox handler keeps them in the inbox (crm.inbox_kinds.Retry), given to it again with
a growing delay until their send is recorded. Events for ids we never sent (another system on the
same ESP account) are set aside after the inbox's last retry, about an hour later; they are
answered 200, not refused, so the ESP does not retry them forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from anymail.signals import AnymailTrackingEvent, EventType, RejectReason
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone

from campaigns import links
from campaigns.models import BounceType, CampaignMetric, EmailMessage
from crm.models import OptOutSource
from crm.services import customers_opt_out
from integrations.email.bounces import Failure, classify_esp_bounce, esp_event_markers
from messaging import suppression
from messaging.models import EmailSuppression

logger = logging.getLogger(__name__)

Status = EmailMessage.Status


def events_apply(
    *, esp_name: str, events: list[AnymailTrackingEvent], organization_id: int | None = None
) -> list[AnymailTrackingEvent]:
    """Apply parsed ESP tracking events to their campaign messages (of that organization, when given),
    in order, finding them all with one query; returns the early ones (their message id is not
    recorded yet), in order, for the caller to give again later. Safe to run twice: every
    transition is a compare-and-set."""
    wanted = {str(e.message_id) for e in events if e.event_type in _HANDLERS and e.message_id}
    found = _messages(wanted, organization_id)
    early: list[AnymailTrackingEvent] = []
    for event in events:
        handler = _HANDLERS.get(event.event_type)
        if handler is None:
            continue
        if not event.message_id:
            logger.info("%s %s event without a message id: ignored", esp_name, event.event_type)
            continue
        message = found.get(str(event.message_id))
        if message is None:
            early.append(event)
            continue
        handler(message, event, esp_name)
    if early:
        logger.info(
            "%s: %d events for message ids not recorded (yet), kept for a retry: %s",
            esp_name,
            len(early),
            ", ".join(sorted({str(e.message_id) for e in early})[:10]),
        )
    return early


def _messages(esp_message_ids: set[str], organization_id: int | None = None) -> dict[str, EmailMessage]:
    """The messages with these ESP ids (of that organization, when given), by id: one query."""
    if not esp_message_ids:
        return {}
    messages = EmailMessage.objects.filter(esp_message_id__in=esp_message_ids)
    if organization_id is not None:
        # A webhook URL of one organization (authenticated by that organization's provider account)
        # never touches another organization's messages.
        messages = messages.filter(organization_id=organization_id)
    fields = ("id", "status", "campaign_id", "organization_id", "customer_id", "email", "esp_message_id")
    return {str(m.esp_message_id): m for m in messages.only(*fields)}


def message_bounced(*, message: EmailMessage, detail: str) -> bool:
    """A sent message bounced hard: BOUNCED, counted, its address suppressed. True only the first time."""
    with transaction.atomic():
        changed = EmailMessage.objects.filter(pk=message.pk, status=Status.SENT).update(
            status=Status.BOUNCED,
            bounce_type=BounceType.HARD,
            bounce_message=detail[:2000],
            failed_at=timezone.now(),
        )
        if changed:
            CampaignMetric.objects.filter(campaign_id=message.campaign_id).update(
                bounced=F("bounced") + 1, delivered=F("delivered") - 1
            )
            _suppress(message, EmailSuppression.Reason.HARD_BOUNCE, detail)
    return bool(changed)


def message_blocked(*, message: EmailMessage, detail: str) -> bool:
    """A sent message was refused by the receiving server's policy (blocklist, reputation, content):
    BLOCKED and counted apart; the address is not suppressed. True only the first time."""
    with transaction.atomic():
        changed = EmailMessage.objects.filter(pk=message.pk, status=Status.SENT).update(
            status=Status.BLOCKED, bounce_message=detail[:2000], failed_at=timezone.now()
        )
        if changed:
            CampaignMetric.objects.filter(campaign_id=message.campaign_id).update(
                blocked=F("blocked") + 1, delivered=F("delivered") - 1
            )
    return bool(changed)


def message_deferred(*, message: EmailMessage, detail: str) -> bool:
    """Note a delay the ESP reported on a sent message (it may still be delivered)."""
    return bool(
        EmailMessage.objects.filter(pk=message.pk, status=Status.SENT).update(bounce_message=detail[:2000])
    )


def message_complained(*, message: EmailMessage, detail: str) -> bool:
    """The recipient marked it as spam: suppress the address and opt the customer out of email."""
    with transaction.atomic():
        _suppress(message, EmailSuppression.Reason.COMPLAINT, detail)
        return _customer_opt_out(message)


def _customer_opt_out(message: EmailMessage) -> bool:
    """The ESP says the recipient opted out (or complained): out of email, an existing opt-out kept."""
    return bool(
        customers_opt_out(customer_ids=[message.customer_id], channel="email", source=OptOutSource.PROVIDER)
    )


def _suppress(message: EmailMessage, reason: str, detail: str) -> None:
    if not message.email:
        return
    suppression.addresses_suppress(
        organization_id=message.organization_id, entries=[(message.email, detail)], reason=reason
    )


def _detail(event: AnymailTrackingEvent, esp_name: str) -> str:
    raw = esp_event_markers(event.esp_event)
    kind = raw.get("Type") or raw.get("reason") or raw.get("type") or raw.get("event")
    kind = kind or event.reject_reason or event.event_type
    parts = [f"{esp_name} {kind}:", event.description or "", event.mta_response or "", _reason(event)]
    return " ".join(dict.fromkeys(p for p in parts if p)).strip()


def _reason(event: AnymailTrackingEvent) -> str:
    """The ESP's own words when anymail keeps none (SendGrid's dropped "reason", Brevo's "reason")."""
    raw = event.esp_event
    reason = raw.get("reason") if isinstance(raw, dict) else None
    return reason[:500] if isinstance(reason, str) else ""


def message_dropped(*, message: EmailMessage, detail: str, opted_out: bool) -> bool:
    """The ESP did not send it (dropped, an error): FAILED with the ESP's reason, counted failed, the
    address kept; when the ESP dropped it because the address unsubscribed, the customer is opted
    out of email (not a hard bounce). True only the first time."""
    with transaction.atomic():
        changed = EmailMessage.objects.filter(pk=message.pk, status=Status.SENT).update(
            status=Status.FAILED,
            bounce_message=detail[:2000],
            error_reason=detail[:2000],
            failed_at=timezone.now(),
        )
        if changed:
            CampaignMetric.objects.filter(campaign_id=message.campaign_id).update(
                failed=F("failed") + 1, delivered=Greatest(F("delivered") - 1, 0)
            )
        if opted_out:
            _customer_opt_out(message)
    return bool(changed)


def _bounced(message: EmailMessage, event: AnymailTrackingEvent, esp_name: str) -> None:
    if event.reject_reason == RejectReason.UNSUBSCRIBED:
        # SendGrid's "dropped: Unsubscribed Address": the address asked the ESP to stop.
        message_dropped(message=message, detail=_detail(event, esp_name), opted_out=True)
        return
    response = " ".join(p for p in (event.mta_response, event.description) if p)
    kind = classify_esp_bounce(markers=esp_event_markers(event.esp_event), response=response)
    detail = _detail(event, esp_name)
    if kind is Failure.BLOCKED:
        message_blocked(message=message, detail=detail)
    elif kind is Failure.SOFT_BOUNCE and event.event_type == EventType.BOUNCED:
        message_deferred(message=message, detail=detail)
    else:
        message_bounced(message=message, detail=detail)


_HANDLERS: dict[str, Callable[[EmailMessage, AnymailTrackingEvent, str], object]] = {
    EventType.BOUNCED: _bounced,
    EventType.REJECTED: _bounced,
    # Brevo's "error": the ESP could not send it.
    EventType.FAILED: lambda m, e, esp: message_dropped(message=m, detail=_detail(e, esp), opted_out=False),
    EventType.DEFERRED: lambda m, e, esp: message_deferred(message=m, detail=_detail(e, esp)),
    EventType.COMPLAINED: lambda m, e, esp: message_complained(message=m, detail=_detail(e, esp)),
    EventType.UNSUBSCRIBED: lambda m, e, esp: _customer_opt_out(m),
    EventType.OPENED: lambda m, e, esp: links.message_open(message=m),
    EventType.CLICKED: lambda m, e, esp: links.message_click(message=m),
}
