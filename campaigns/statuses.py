"""Meta status and marketing-preference webhooks applied to messages, metrics and customers.

A message not known to be at Meta (still SENDING, or settled UNKNOWN because its worker died
mid-send) is adopted by the first status that names it (its wamid, or our callback data
`m:<id>`): the counters move from where it was counted (nowhere, or `unknown`) to the state the
status says, once, and its cost is taken from the status's `pricing` block when the send did not
record one.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Q, When
from django.db.models.functions import Greatest

from campaigns import lifecycle
from campaigns.models import OUTCOME_UNKNOWN, CampaignMetric, WhatsappMessage
from crm import bulk
from crm.models import Customer, OptOutSource
from crm.services import customers_opt_out, customers_opt_out_undo
from integrations.models import WhatsappNumber, WhatsappPrice
from integrations.services import whatsapp_price_currency
from integrations.whatsapp.phones import phone_region
from integrations.whatsapp.pricing import rate_category
from integrations.whatsapp.webhooks import PreferenceEvent, StatusEvent

logger = logging.getLogger(__name__)

Status = WhatsappMessage.Status
CALLBACK_RE = re.compile(r"m:([1-9][0-9]{0,17})")
# 55 + area code + an old 8-digit mobile (Meta's wa_id may lack the ninth digit we store).
BR_MOBILE_WITHOUT_NINTH_RE = re.compile(r"(55[1-9][0-9])([6-9][0-9]{7})")
RANK = {
    Status.QUEUED: 0,
    Status.SENDING: 0,
    Status.UNKNOWN: 0,
    Status.SENT: 1,
    Status.DELIVERED: 2,
    Status.READ: 3,
}
STATUS_BY_RANK = {1: Status.SENT, 2: Status.DELIVERED, 3: Status.READ}
EVENT_RANK = {"sent": 1, "delivered": 2, "read": 3}
COUNTERS = ("sent", "delivered", "read", "failed", "unknown")
FIELDS = [
    "cost",
    "cost_currency",
    "status",
    "wamid",
    "wa_id",
    "sent_at",
    "delivered_at",
    "read_at",
    "failed_at",
    "error_code",
    "error_reason",
]
# Opt-outs a WhatsApp "resume" may undo: those that came from WhatsApp itself. An unsubscribe
# link, an operator or the ERP recorded a choice Meta knows nothing about.
RESUMABLE_SOURCES = (OptOutSource.REPLY, OptOutSource.PROVIDER)


def _rank(message: WhatsappMessage) -> int | None:
    """How far the message got (0 = not known to be at Meta); None when no status may move it."""
    if message.status == Status.FAILED:
        # Settled before the UNKNOWN status existed (migration 0011 moves them; kept for a row
        # settled by an old worker during the deploy).
        unknown = message.wamid is None and message.error_reason == OUTCOME_UNKNOWN
        return 0 if unknown else None
    return RANK.get(Status(message.status))


def _counted(message: WhatsappMessage) -> tuple[bool, ...]:
    """Which CampaignMetric counters hold this message, in COUNTERS order."""
    status = message.status
    return (
        status in (Status.SENT, Status.DELIVERED, Status.READ)
        or (status == Status.FAILED and message.sent_at is not None),
        status in (Status.DELIVERED, Status.READ),
        status == Status.READ,
        status == Status.FAILED,
        status == Status.UNKNOWN,
    )


def _adopt(message: WhatsappMessage, event: StatusEvent) -> None:
    message.wamid = event.wamid
    if not message.wa_id and event.recipient_id:
        message.wa_id = event.recipient_id[:20]


def _apply(message: WhatsappMessage, event: StatusEvent) -> bool:
    """Move the message forward by one event (in memory); False when the event changes nothing."""
    rank = _rank(message)
    if rank is None:
        return False
    if event.status == "failed":
        # Delivered is final for us: a later failure report cannot undo the delivery.
        if rank >= EVENT_RANK["delivered"]:
            return False
        _adopt(message, event)
        message.status = Status.FAILED
        message.error_code = event.error_code
        message.error_reason = (event.error_title or "failed (status webhook)")[:2000]
        message.failed_at = event.timestamp
        return True
    target = EVENT_RANK[event.status]
    if target <= rank:
        return False
    if rank == 0:
        _adopt(message, event)
        message.error_code, message.error_reason, message.failed_at = None, "", None
    message.status = STATUS_BY_RANK[target]
    if message.sent_at is None:
        message.sent_at = event.timestamp
    if target >= EVENT_RANK["delivered"] and message.delivered_at is None:
        message.delivered_at = event.timestamp
    if target == EVENT_RANK["read"]:
        message.read_at = event.timestamp
    return True


def _free(message: WhatsappMessage, event: StatusEvent) -> bool:
    """Meta says this message costs nothing (`billable: false`, or it failed) and it holds a cost."""
    return bool(message.cost) and (event.billable is False or event.status == "failed")


def _callback_id(event: StatusEvent) -> int | None:
    match = CALLBACK_RE.fullmatch(event.biz_opaque_callback_data)
    return int(match.group(1)) if match else None


@dataclass
class _Tracked:
    message: WhatsappMessage
    before: tuple[bool, ...]
    settled: bool  # it was not known to be at Meta
    changed: bool = False
    cost: Decimal = Decimal("0")  # taken from a status's pricing block in this call
    refund: Decimal = Decimal("0")  # a recorded cost Meta says it does not charge
    free: bool = False  # Meta said so in this call: no later status of the call prices it again


def _prices(events: list[StatusEvent]) -> dict[tuple[str, str], Decimal]:
    """The rate card for the categories the events' pricing blocks name: one query."""
    categories = {rate_category(e.pricing_category) for e in events if e.billable}
    categories.discard(None)
    if not categories:
        return {}
    rows = WhatsappPrice.objects.filter(category__in=categories).values_list("category", "country", "price")
    return {(category, country): price for category, country, price in rows}


def _priced(message: WhatsappMessage, event: StatusEvent, prices: dict[tuple[str, str], Decimal]) -> Decimal:
    """What Meta says this message costs (its pricing block, billable, on our rate card); 0 if unsaid."""
    category = rate_category(event.pricing_category) if event.billable else None
    if category is None:
        return Decimal("0")
    phone = message.phone or (f"+{event.recipient_id}" if event.recipient_id.isdigit() else "")
    region = phone_region(phone) if phone else "*"
    return prices.get((category, region), prices.get((category, "*"), Decimal("0")))


def statuses_apply(*, events: list[StatusEvent]) -> dict[str, int]:
    """Apply status events monotonically; returns counts applied/ignored/unknown/settled.

    Safe to run twice with the same events (a duplicate changes nothing and counts nothing). Rows
    are locked while applied, so concurrent webhook requests for one message never double count.
    """
    counts = {"applied": 0, "ignored": 0, "unknown": 0, "settled": 0}
    if not events:
        return counts
    # Meta batches are not ordered; oldest first makes a failure after a delivery lose, as it should.
    ordered = sorted(events, key=lambda e: e.timestamp)
    prices = _prices(ordered)
    currency = whatsapp_price_currency() if prices else ""
    with transaction.atomic():
        by_wamid, by_id = _locked_messages(ordered)
        tracked = _track(ordered, by_wamid, by_id, prices, counts, currency)
        changes = _changes(tracked.values())
        counts["settled"] = changes.settled
        if changes.dirty:
            bulk.update_rows(WhatsappMessage, changes.dirty, FIELDS)
        for campaign_id, delta in changes.deltas.items():
            _metric_add(campaign_id, delta, changes.costs[campaign_id], currency)
        for (campaign_id, refund_currency), refund in changes.refunds.items():
            CampaignMetric.objects.filter(campaign_id=campaign_id, cost_currency=refund_currency).update(
                cost=Greatest(F("cost") - refund, Decimal("0"))
            )
    for campaign_id in sorted(changes.deltas):
        lifecycle.campaign_complete_if_done(campaign_id=campaign_id)
    if counts["settled"]:
        logger.info("status webhooks settled %s in-flight message(s)", counts["settled"])
    return counts


def _locked_messages(
    events: list[StatusEvent],
) -> tuple[dict[str, WhatsappMessage], dict[int, WhatsappMessage]]:
    """The messages the events name (by wamid or callback data), locked: (by wamid, by id)."""
    wamids = {e.wamid for e in events}
    ids = {i for i in map(_callback_id, events) if i is not None}
    rows = list(
        WhatsappMessage.objects.select_for_update().filter(Q(wamid__in=wamids) | Q(id__in=ids)).order_by("pk")
    )
    return {m.wamid: m for m in rows if m.wamid}, {m.pk: m for m in rows}


def _message_of(
    event: StatusEvent, by_wamid: dict[str, WhatsappMessage], by_id: dict[int, WhatsappMessage]
) -> WhatsappMessage | None:
    """The message the event is about: its wamid's, else the one our callback data names."""
    message = by_wamid.get(event.wamid)
    if message is not None:
        return message
    # A message whose worker died (or has not recorded yet) after Meta accepted it has no wamid:
    # the callback data we sent names it. Never adopt one that has a wamid of its own.
    candidate = by_id.get(_callback_id(event) or 0)
    return candidate if candidate is not None and candidate.wamid is None else None


def _track(
    events: list[StatusEvent],
    by_wamid: dict[str, WhatsappMessage],
    by_id: dict[int, WhatsappMessage],
    prices: dict[tuple[str, str], Decimal],
    counts: dict[str, int],
    currency: str,
) -> dict[int, _Tracked]:
    """Apply the events in order to their messages, in memory; counts applied/ignored/unknown."""
    tracked: dict[int, _Tracked] = {}
    for event in events:
        message = _message_of(event, by_wamid, by_id)
        if message is None:
            counts["unknown"] += 1
            continue
        if message.pk not in tracked:
            tracked[message.pk] = _Tracked(message, _counted(message), _rank(message) == 0)
        if _free(message, event):
            # Meta charges nothing for it (not billable, or it failed): the cost recorded is taken
            # back from the message and its campaign, once (a cost priced earlier in this same call
            # never reached the campaign's total: it is dropped, not refunded).
            t = tracked[message.pk]
            taken = min(t.cost, message.cost)
            t.cost -= taken
            t.refund += message.cost - taken
            t.changed = t.free = True
            message.cost = Decimal("0")
        if not _apply(message, event):
            counts["ignored"] += 1
            continue
        counts["applied"] += 1
        t = tracked[message.pk]
        t.changed = True
        if t.settled and not message.cost and not t.free:
            # The send never recorded what Meta charged (its worker died, or it is still
            # recording: it then keeps this cost, campaigns.whatsapp.plan.BatchPlan.reconciled).
            t.cost = message.cost = _priced(message, event, prices)
            message.cost_currency = currency if t.cost else message.cost_currency
        by_wamid[event.wamid] = message
    return tracked


@dataclass
class _Changes:
    """What the applied events change: the rows to write, each campaign's counters and cost."""

    dirty: list[WhatsappMessage] = field(default_factory=list)
    deltas: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    costs: dict[int, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    # Per campaign and currency: recorded costs Meta does not charge.
    refunds: dict[tuple[int, str], Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    settled: int = 0  # messages not known to be at Meta that a status placed there


def _changes(tracked: Iterable[_Tracked]) -> _Changes:
    changes = _Changes()
    for t in tracked:
        if not t.changed:
            continue
        changes.dirty.append(t.message)
        after = _counted(t.message)
        for name, was, now in zip(COUNTERS, t.before, after, strict=True):
            changes.deltas[t.message.campaign_id][name] += int(now) - int(was)
        changes.costs[t.message.campaign_id] += t.cost
        if t.refund:
            changes.refunds[(t.message.campaign_id, t.message.cost_currency)] += t.refund
        if t.settled and _rank(t.message) != 0:
            changes.settled += 1
    return changes


def _metric_add(campaign_id: int, delta: Counter[str], cost: Decimal, currency: str) -> None:
    """One UPDATE of the campaign's counters and cost; a decrement never takes one below zero. A
    cost in another currency than the campaign's total is never added to it (it stays on its
    message, with its currency)."""
    changes: dict[str, Any] = {
        name: F(name) + n if n > 0 else Greatest(F(name) + n, 0) for name, n in delta.items() if n != 0
    }
    if cost:
        changes["cost"] = Case(When(cost_currency=currency, then=F("cost") + cost), default=F("cost"))
    if changes:
        CampaignMetric.objects.filter(campaign_id=campaign_id).update(**changes)


def wa_id_phones(wa_id: str) -> list[str]:
    """The E.164 numbers a wa_id may be stored as (with the Brazilian ninth digit added back)."""
    phones = [f"+{wa_id}"]
    match = BR_MOBILE_WITHOUT_NINTH_RE.fullmatch(wa_id)
    if match:
        phones.append(f"+{match.group(1)}9{match.group(2)}")
    return phones


def _latest(events: Iterable[PreferenceEvent]) -> list[PreferenceEvent]:
    latest: dict[tuple[str, str], PreferenceEvent] = {}
    for event in events:
        key = (event.phone_number_id, event.wa_id)
        if key not in latest or event.timestamp >= latest[key].timestamp:
            latest[key] = event
    return list(latest.values())


def preferences_apply(*, events: list[PreferenceEvent]) -> int:
    """Record marketing stop/resume for the customers with the wa_id's phone in the organization that
    owns the receiving number (a consent decision belongs to one company, LGPD); returns how many
    changed. An event for a number no organization has changes nobody.

    The latest event per number and wa_id wins. Safe to run twice: a customer already in that state
    is not counted again.
    """
    latest = _latest(events)
    owners = dict(
        WhatsappNumber.objects.filter(
            phone_number_id__in={e.phone_number_id for e in latest if e.phone_number_id}
        ).values_list("phone_number_id", "organization_id")
    )
    changed = 0
    for event in latest:
        organization_id = owners.get(event.phone_number_id)
        if organization_id is None:
            continue
        customers = Customer.objects.filter(
            organization_id=organization_id, phone__in=wa_id_phones(event.wa_id)
        ).values_list("pk", flat=True)
        if event.value == "stop":
            changed += customers_opt_out(
                customer_ids=customers, channel="whatsapp", source=OptOutSource.REPLY, at=event.timestamp
            )
        else:
            changed += customers_opt_out_undo(
                customer_ids=customers, channel="whatsapp", sources=RESUMABLE_SOURCES
            )
    return changed
