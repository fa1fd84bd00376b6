"""Inbound WhatsApp messages applied from the inbox: stored once per wamid, routed by the receiving
number to its organization (and store), tied to the customer by phone (created, without marketing
consent, when unknown) and to the campaign message answered; opt-out and resume keywords honoured
at once; every reply announced (`whatsapp_reply`) and queued for the organization's Chatwoot.

One batch is one transaction (the inbox drain's): a reply is stored with its opt-out, its customer
and its events, or not at all, and the drain's lock keeps batches in acceptance order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from campaigns.models import WhatsappMessage
from campaigns.statuses import RESUMABLE_SOURCES, wa_id_phones
from crm import hooks
from crm.models import ATTRIBUTION_WINDOW_MAX_DAYS, Customer, OptOutSource, Organization
from crm.services import customers_opt_out, customers_opt_out_undo
from integrations.models import ChatwootAccount, WhatsappNumber
from integrations.whatsapp.webhooks import InboundMessage
from messaging import chatwoot_inbound, conversations
from messaging.models import ConversationMessage

logger = logging.getLogger(__name__)

Direction = ConversationMessage.Direction
# A keyword's resume undoes what a keyword, a WhatsApp stop or the provider recorded.
KEYWORD_RESUMABLE = (*RESUMABLE_SOURCES, OptOutSource.KEYWORD)
# Meta's timestamps are whole seconds of its clock: a reply may look a little older than our send.
SKEW = timedelta(seconds=60)


@dataclass(frozen=True)
class _Number:
    id: int
    organization_id: int
    store_id: int | None


def _numbers(messages: Iterable[InboundMessage]) -> dict[str, _Number]:
    ids = {m.phone_number_id for m in messages if m.phone_number_id}
    rows = WhatsappNumber.objects.filter(phone_number_id__in=ids).values_list(
        "phone_number_id", "pk", "organization_id", "store_id"
    )
    return {pnid: _Number(pk, org, store) for pnid, pk, org, store in rows}


def _customer_phone(wa_id: str) -> str:
    """The E.164 phone a new customer is created with (the Brazilian ninth digit added back)."""
    return wa_id_phones(wa_id)[-1]


def _customers(pairs: set[tuple[int, str]], names: dict[tuple[int, str], str]) -> tuple[dict, list[Customer]]:
    """(organization, wa_id) -> customer id, creating the unknown ones (no marketing consent)."""
    phones = {(org, phone): wa_id for org, wa_id in pairs for phone in wa_id_phones(wa_id)}
    query = Q()
    for org, wa_id in pairs:
        query |= Q(organization_id=org, phone__in=wa_id_phones(wa_id))
    found: dict[tuple[int, str], int] = {}
    for pk, org, phone in (
        Customer.objects.filter(query).order_by("pk").values_list("pk", "organization_id", "phone")
    ):
        found.setdefault((org, phones[(org, phone)]), pk)
    missing = sorted(pairs - set(found))
    created = Customer.objects.bulk_create(
        [
            Customer(organization_id=org, phone=_customer_phone(wa_id), name=names.get((org, wa_id), ""))
            for org, wa_id in missing
        ]
    )
    for (org, wa_id), customer in zip(missing, created, strict=True):
        found[(org, wa_id)] = customer.pk
    return found, created


def _answered(messages: list[tuple[InboundMessage, _Number, int]]) -> dict[str, tuple[int, int]]:
    """wamid of each inbound -> (campaign id, campaign message id) it answers: the message its context
    names, else the customer's latest campaign message from that number within the attribution window."""
    contexts = {m.context_wamid for m, _, _ in messages if m.context_wamid}
    # Only a message of the number's own organization: a context naming another's is not an answer.
    by_wamid = {
        (w, org): (campaign, pk)
        for w, org, campaign, pk in WhatsappMessage.objects.filter(wamid__in=contexts).values_list(
            "wamid", "organization_id", "campaign_id", "pk"
        )
    }
    answered = {
        m.wamid: by_wamid[(m.context_wamid, n.organization_id)]
        for m, n, _ in messages
        if (m.context_wamid, n.organization_id) in by_wamid
    }
    rest = [(m, n, c) for m, n, c in messages if m.wamid not in answered]
    if not rest:
        return answered
    windows = dict(
        Organization.objects.filter(pk__in={n.organization_id for _, n, _ in rest}).values_list(
            "pk", "attribution_window_days"
        )
    )
    since = min(m.timestamp for m, _, _ in rest) - timedelta(days=ATTRIBUTION_WINDOW_MAX_DAYS)
    sent = (
        WhatsappMessage.objects.filter(customer_id__in={c for _, _, c in rest}, sent_at__gte=since)
        .filter(Q(whatsapp_number_id__in={n.id for _, n, _ in rest}) | Q(whatsapp_number__isnull=True))
        .order_by("customer_id", "-sent_at")
        .values_list(
            "customer_id",
            "sent_at",
            "campaign_id",
            "pk",
            "whatsapp_number_id",
            "campaign__whatsapp_number_id",
        )
    )
    latest: dict[int, list[tuple]] = {}
    for row in sent:
        latest.setdefault(row[0], []).append(row[1:])
    for m, n, customer_id in rest:
        window = timedelta(days=windows.get(n.organization_id, 7))
        for sent_at, campaign_id, pk, number_id, campaign_number_id in latest.get(customer_id, []):
            if (
                number_id or campaign_number_id
            ) == n.id and m.timestamp - window <= sent_at <= m.timestamp + SKEW:
                answered[m.wamid] = (campaign_id, pk)
                break
    return answered


def _fresh(messages: list[InboundMessage]) -> list[InboundMessage]:
    """The batch's messages not stored yet, once each, in timestamp order."""
    unique = {m.wamid: m for m in messages}
    stored = set(ConversationMessage.objects.filter(wamid__in=unique).values_list("wamid", flat=True))
    return sorted((m for w, m in unique.items() if w not in stored), key=lambda m: m.timestamp)


def inbound_apply(*, messages: list[InboundMessage]) -> dict[str, int]:
    """Store and act on a batch of inbound messages; returns counts stored/duplicate/unrouted/
    created/opted_out/resumed. Safe to run twice: a wamid already stored is skipped."""
    fresh = _fresh(messages)
    counts = {
        "stored": 0,
        "duplicate": len(messages) - len(fresh),
        "unrouted": 0,
        "created": 0,
        "opted_out": 0,
        "resumed": 0,
    }
    numbers = _numbers(fresh)
    routed = [(m, numbers[m.phone_number_id]) for m in fresh if m.phone_number_id in numbers]
    counts["unrouted"] = len(fresh) - len(routed)
    if counts["unrouted"]:
        logger.warning("%s inbound message(s) for a number no organization has: dropped", counts["unrouted"])
    if not routed:
        return counts
    pairs = {(n.organization_id, m.wa_id) for m, n in routed}
    names = {(n.organization_id, m.wa_id): m.profile_name for m, n in routed}
    customers, created = _customers(pairs, names)
    counts["created"] = len(created)
    placed = [(m, n, customers[(n.organization_id, m.wa_id)]) for m, n in routed]
    answered = _answered(placed)
    chatwoot_orgs = set(
        ChatwootAccount.objects.filter(
            organization_id__in={n.organization_id for _, n, _ in placed}, enabled=True
        ).values_list("organization_id", flat=True)
    )
    rows = ConversationMessage.objects.bulk_create(
        [_row(m, n, c, answered.get(m.wamid), n.organization_id in chatwoot_orgs) for m, n, c in placed]
    )
    counts["stored"] = len(rows)
    _honour_keywords(rows, counts)
    _announce(rows, created)
    for organization_id in sorted({r.organization_id for r in rows if r.chatwoot_pending}):
        chatwoot_inbound.push_enqueue(organization_id=organization_id)
    return counts


def _row(
    m: InboundMessage, n: _Number, customer_id: int, answered: tuple[int, int] | None, to_chatwoot: bool
) -> ConversationMessage:
    return ConversationMessage(
        organization_id=n.organization_id,
        customer_id=customer_id,
        whatsapp_number_id=n.id,
        store_id=n.store_id,
        direction=Direction.INBOUND,
        kind=m.kind,
        text=m.text,
        payload=m.payload,
        media_id=m.media_id,
        media_mime=m.media_mime,
        media_filename=m.media_filename,
        wamid=m.wamid,
        context_wamid=m.context_wamid,
        campaign_id=answered[0] if answered else None,
        campaign_message_id=answered[1] if answered else None,
        at=m.timestamp,
        chatwoot_pending=to_chatwoot,
    )


def _honour_keywords(rows: list[ConversationMessage], counts: dict[str, int]) -> None:
    """Opt out (source "keyword") or back in at once, in the order the customer wrote; the
    confirmation goes out as a reply inside the window the message just opened."""
    keywords: dict[int, conversations.Keywords] = {}
    for row in rows:
        org = row.organization_id
        if org not in keywords:
            keywords[org] = conversations.Keywords.of(conversations.settings_for(org))
        intent = keywords[org].intent(kind=row.kind, text=row.text, payload=row.payload)
        if not intent:
            continue
        if intent == "opt_out":
            changed = customers_opt_out(
                customer_ids=[row.customer_id], channel="whatsapp", source=OptOutSource.KEYWORD, at=row.at
            )
            counts["opted_out"] += changed
        else:
            changed = customers_opt_out_undo(
                customer_ids=[row.customer_id], channel="whatsapp", sources=KEYWORD_RESUMABLE
            )
            counts["resumed"] += changed
        if changed:
            _confirm(row, intent)


def _confirm(row: ConversationMessage, intent: str) -> None:
    settings = conversations.settings_for(row.organization_id)
    text = settings.opt_out_confirmation if intent == "opt_out" else settings.resume_confirmation
    if text.strip():
        customer = Customer.objects.get(pk=row.customer_id)
        conversations.reply_queue(
            customer=customer,
            text=text,
            source=ConversationMessage.Source.CONFIRMATION,
            number=row.whatsapp_number,
        )


def _announce(rows: list[ConversationMessage], created: list[Customer]) -> None:
    """The platform's customer events: the customers created, then one whatsapp_reply per message."""
    now = timezone.now()
    events = [
        hooks.CustomerEvent(
            kind="customer_created", organization_id=c.organization_id, customer_id=c.pk, at=now
        )
        for c in created
    ]
    events += [
        hooks.CustomerEvent(
            kind="whatsapp_reply",
            organization_id=r.organization_id,
            customer_id=r.customer_id,
            at=r.at,
            key=r.wamid or "",
            data={
                "text": r.text,
                "number_id": r.whatsapp_number_id,
                "message_id": r.pk,
                **({"campaign_id": r.campaign_id} if r.campaign_id else {}),
            },
        )
        for r in rows
    ]
    hooks.customer_events(events)
