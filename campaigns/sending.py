"""Sending one batch of WhatsApp messages: the seed's send job, for many messages at once.

`whatsapp_send_batch` claims the batch's queued messages and runs them through named steps:

- `batch_eligible`: who may receive it now (consent, a phone in E.164, the contact caps checked
  again at send time, template values as Meta takes them: integrations.whatsapp.parameters folds
  new-lines, tabs and runs of spaces (132018 prevented) and none may be empty (131008 prevented)),
  the rest grouped by the number they go from, each with its template message and URL buttons.
- `_book_lanes`: each number's credentials, fresh from the database and decrypted in memory only,
  and its pacing slots; the messages beyond the pacing horizon go back to QUEUED and wait.
- `batch_send`: the Graph API calls, every number's concurrently, no transaction open, started on
  the process's event loop: while a paced chunk is in flight the job claims the next chunk and
  books its slots (`_send_chunks`), so the number's schedule never idles.
- `batch_classify`: Meta's answers into a `BatchPlan`, pure: which messages are sent (and their
  cost), failed, of unknown outcome, retried or released, which customers opted out, whether the
  organization or a number is paused and why, how long the batch waits.
- `batch_apply`: the plan in one transaction of bulk statements, only over rows still SENDING
  (`BatchPlan.reconciled`), metrics with F(); then the Chatwoot mirror (its own job) and the
  campaign stopped when its template is broken.

The last run of the batch marks the campaign complete. Exactly once: messages are claimed
(QUEUED -> SENDING) in the database before Meta is called, so a retry, a second worker or a re-run
after a crash only ever sees the ones still QUEUED.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from campaigns import caps, lift, links, services
from campaigns.models import Campaign, CampaignMetric, WhatsappMessage
from campaigns.variables import template_variable
from crm import aio, bulk, jobs, ratelimit
from crm.jobs import Defer
from crm.models import Customer, OptOutSource, Store
from crm.services import customers_opt_out, organizations_pause
from integrations.clients import graph_client
from integrations.models import WhatsappNumber, WhatsappPrice
from integrations.services import whatsapp_numbers_pause, whatsapp_price_currency
from integrations.whatsapp.client import GraphClient, SendResult, TemplateMessage, UrlButton
from integrations.whatsapp.parameters import template_text
from integrations.whatsapp.phones import normalize_phone, phone_region
from messaging import decisions, pacing
from messaging.decisions import Verdict

logger = logging.getLogger(__name__)

Status = WhatsappMessage.Status
ATTEMPTS = 2  # the seed: 2 attempts, exponential backoff from 1 s
RETRY_BACKOFF = 1.0
THROTTLE_DELAY = 5.0
PAUSED_DELAY = services.PAUSED_DELAY
# A message Meta accepted that its status webhook has already moved on (it was counted as sent there).
_WEBHOOK_SETTLED = (Status.SENT, Status.DELIVERED, Status.READ)


def template_values(*, customer: Customer, sources: list[str], store_name: str) -> list[str]:
    """The template's body values for a customer, as Meta gets them (folded white space, its length
    limit: integrations.whatsapp.parameters); "" for one that is empty."""
    return [template_text(template_variable(customer, source, store_name)) for source in sources]


def _link(kind: str, message: WhatsappMessage) -> str:
    # A template's URL button ends in a variable ("https://<our host>/{{1}}"). The seed put a
    # __REDIRECT_URL__ sentinel there and replaced it per message; the value here is the
    # message's signed redirect ("r/…") or unsubscribe ("u/…") path on our own host.
    return links.link_path(kind, message)


@dataclass
class _Lane:
    """One sending number's share of a batch: its credentials, its pacing slots, its messages."""

    number: WhatsappNumber
    items: list[tuple[WhatsappMessage, TemplateMessage]]
    token: str = ""
    client: GraphClient | None = None
    slots: ratelimit.Slots = field(default_factory=lambda: ratelimit.Slots(0.0, 0.0))


# --- The job -------------------------------------------------------------------------------------


def whatsapp_send_batch(*, campaign_id: int, batch: int) -> dict[str, int]:
    """Send every still-queued message of one batch. Returns counts by outcome.

    Raises Defer (no attempt spent) while the campaign is paused, the organization's sending is
    paused, messages wait for their paused number, for their number's pacing (beyond
    WHATSAPP_PACE_WINDOW), or for a retry or a throttle to pass.
    """
    campaign = Campaign.objects.select_related(
        "organization", "whatsapp_number", "whatsapp_number__store"
    ).get(pk=campaign_id)
    if not services.batch_may_send(campaign=campaign, batch=batch):
        return {}
    paused = paused_numbers(organization_id=campaign.organization_id)
    of_paused = _of_paused(campaign, paused)
    counts = _send_chunks(campaign, batch, paused=of_paused)
    _defer_while_paused(campaign_id, batch, of_paused, paused)
    services.campaign_complete_if_done(campaign_id=campaign_id)
    return counts


@dataclass
class _Flight:
    """A chunk's claimed messages on their way: their sends run on the process's event loop while
    the job goes on (claims and books the next chunk); `_land` takes Meta's answers and writes them."""

    claimed: int
    messages: list[WhatsappMessage]
    skipped: dict[int, str]
    lanes: list[_Lane]
    pace_wait: float | None  # how long until the messages held beyond the pacing horizon may go
    sends: concurrent.futures.Future[list[Outcome]] | None
    started: float = field(default_factory=time.monotonic)

    @property
    def pipelines(self) -> bool:
        """Whether the next chunk is claimed and booked while this one is in flight: every number
        paced and every message within the pacing horizon (none waits)."""
        paced = bool(self.lanes) and all(lane.number.messages_per_second for lane in self.lanes)
        return bool(settings.WHATSAPP_SEND_PIPELINE) and paced and self.pace_wait is None


def _send_chunks(campaign: Campaign, batch: int, *, paused: Q | None) -> dict[str, int]:
    """The batch's queued messages, WHATSAPP_SEND_CHUNK at a time; returns counts by outcome.
    Raises Defer when some wait for a retry, a throttle or their number's pacing (the rest waits
    too), Yield after a full chunk when another tenant's work waits ahead (the next run takes the
    rest).

    Pipelined: while a paced chunk's sends are in flight, the next chunk is claimed and its slots
    booked right after them, so the number's schedule never waits for a chunk's last answers
    (Meta's latency) and its writes. At most two chunks in flight, both landed (their answers
    written) before the job defers or yields."""
    counts: dict[str, int] = {}
    handled: list[int] = []
    chunk = max(int(settings.WHATSAPP_SEND_CHUNK), 1)
    flight = _next_chunk(campaign, batch, paused=paused, limit=chunk, handled=handled)
    while flight is not None:
        following = None
        if flight.pipelines:
            try:
                following = _next_chunk(campaign, batch, paused=paused, limit=chunk, handled=handled)
            except Exception:
                _land(campaign, batch, flight, counts)  # Meta has them: their answers are written first
                raise
        delays = _land(campaign, batch, flight, counts)
        try:
            if delays:
                # Before the batches queued meanwhile: its numbers' next slots are its own.
                raise Defer(
                    min(delays),
                    "messages wait for a retry, a throttle or their number's pacing",
                    at_front=True,
                )
            if flight.claimed == chunk:
                # Another tenant's batch waiting on this queue runs now, not after this one: the job
                # goes back to the head of its tenant's list and its next run takes the rest.
                jobs.yield_turn(f"batch {campaign.pk}/{batch}: another tenant's work waits")
        except Defer as stop:
            if following is not None:  # in flight too: its answers are written before the job goes
                waits = _land(campaign, batch, following, counts)
                if waits and isinstance(stop, jobs.Yield):  # then its messages wait for their time
                    raise Defer(min(waits), stop.reason, at_front=True) from None
            raise
        if following is None and not flight.pipelines:
            following = _next_chunk(campaign, batch, paused=paused, limit=chunk, handled=handled)
        flight = following
    return counts


def _next_chunk(
    campaign: Campaign, batch: int, *, paused: Q | None, limit: int, handled: list[int]
) -> _Flight | None:
    """The batch's next chunk claimed (its ids added to `handled`), its eligible messages' slots
    booked (those beyond the pacing horizon back to QUEUED) and their sends started; None when
    nothing is left to claim."""
    ids = _claim(campaign.pk, batch, paused=paused, limit=limit, exclude=handled)
    if not ids:
        return None
    handled += ids
    messages, skipped, lanes = batch_eligible(campaign=campaign, ids=ids)
    held, pace_wait = _book_lanes(lanes, claimed=ids)
    if held:
        messages = [m for m in messages if m.pk not in held]
        lanes = [lane for lane in lanes if lane.items]
    return _Flight(len(ids), messages, skipped, lanes, pace_wait, batch_send(lanes))


def _land(campaign: Campaign, batch: int, flight: _Flight, counts: dict[str, int]) -> list[float]:
    """Meta's answers for a chunk in flight, classified and written, its counts added to `counts`;
    returns how long its messages that wait must (none: [])."""
    outcomes = flight.sends.result() if flight.sends is not None else []
    for lane in flight.lanes:
        lane.token = ""
    if outcomes:
        logger.info(
            "batch %s/%s: %s sends from %s number(s) in %.2fs",
            campaign.pk,
            batch,
            len(outcomes),
            len(flight.lanes),
            time.monotonic() - flight.started,
            extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
        )
    prices = _prices(campaign) if outcomes else {}
    plan = batch_apply(
        campaign, batch_classify(outcomes, skipped=flight.skipped, prices=prices), flight.messages
    )
    for outcome, n in plan.counts.items():
        counts[outcome] = counts.get(outcome, 0) + n
    return [d for d in (plan.delay, flight.pace_wait) if d is not None]


def _claim(
    campaign_id: int,
    batch: int,
    *,
    paused: Q | None = None,
    limit: int | None = None,
    exclude: list[int] | None = None,
) -> list[int]:
    """Claim (QUEUED -> SENDING) up to `limit` of the batch's queued messages, in id order, but
    those in `exclude` (already handled by this run: released for a later retry)."""
    with transaction.atomic():
        queued = WhatsappMessage.objects.select_for_update(skip_locked=True).filter(
            campaign_id=campaign_id, batch=batch, status=Status.QUEUED
        )
        if paused is not None:
            queued = queued.exclude(paused)
        if exclude:
            queued = queued.exclude(id__in=exclude)
        ids = list(queued.order_by("id").values_list("id", flat=True)[:limit])
        if ids:
            WhatsappMessage.objects.filter(id__in=ids).update(
                status=Status.SENDING, attempts=F("attempts") + 1, sending_at=timezone.now()
            )
            if not exclude:
                # The batch's control group would have been sent now: its purchase window starts too.
                lift.held_out_stamp(model=WhatsappMessage, campaign_id=campaign_id, batch=batch)
    return ids


def _release(ids: list[int]) -> None:
    """Claimed messages that were not handed to Meta go back to QUEUED, their attempt not spent."""
    if ids:
        WhatsappMessage.objects.filter(id__in=ids, status=Status.SENDING).update(
            status=Status.QUEUED, sending_at=None, attempts=F("attempts") - 1
        )


def paused_numbers(*, organization_id: int) -> dict[int, str]:
    """The organization's WhatsApp numbers Meta refused (WhatsappNumber.paused_at): id -> reason."""
    return dict(
        WhatsappNumber.objects.filter(organization_id=organization_id, paused_at__isnull=False).values_list(
            "pk", "paused_reason"
        )
    )


def _of_paused(campaign: Campaign, paused: dict[int, str]) -> Q | None:
    """The messages that would go from a paused number (no number of their own: the campaign's)."""
    if not paused:
        return None
    of_paused = Q(whatsapp_number_id__in=list(paused))
    if campaign.whatsapp_number_id in paused:
        of_paused |= Q(whatsapp_number_id__isnull=True)
    return of_paused


def _defer_while_paused(campaign_id: int, batch: int, of_paused: Q | None, paused: dict[int, str]) -> None:
    """Raise Defer while messages of this batch wait for a paused number (an operator resumes it)."""
    if of_paused is None:
        return
    queued = WhatsappMessage.objects.filter(campaign_id=campaign_id, batch=batch, status=Status.QUEUED)
    if queued.filter(of_paused).exists():
        reasons = "; ".join(sorted(set(paused.values())))[:200]
        raise Defer(PAUSED_DELAY * 2, f"WhatsApp number paused: {reasons}")


# --- Eligibility ---------------------------------------------------------------------------------


def batch_eligible(
    *, campaign: Campaign, ids: list[int]
) -> tuple[list[WhatsappMessage], dict[int, str], list[_Lane]]:
    """The claimed messages `ids`: (all of them, those to skip with their reason, the rest by the
    number they go from, each with its template message). Skipped: opted out or without consent, an
    invalid phone, over a contact cap (checked again now), an empty template variable. A message
    whose customer is gone is skipped on the spot; a valid phone is kept in its E.164 form."""
    messages = list(WhatsappMessage.objects.filter(id__in=ids).select_related("customer").order_by("id"))
    services.skip_without_customer(model=WhatsappMessage, campaign_id=campaign.pk, ids=ids, found=messages)
    numbers = _senders(campaign, messages)
    names = store_names(numbers)
    # Time has passed since the fan-out applied the contact caps (campaigns.caps).
    capped = caps.skip_reasons(
        campaign=campaign, customer_ids=[m.customer_id for m in messages], now=timezone.now()
    )
    skipped: dict[int, str] = {}
    lanes: dict[int, _Lane] = {}
    for m in messages:
        number_id = m.whatsapp_number_id
        assert number_id is not None  # _senders gave every message one
        body = template_values(
            customer=m.customer,
            sources=campaign.template_variables,
            store_name=names.get(number_id, ""),
        )
        reason = _skip_reason(m, capped) or _empty_variable(campaign, body)
        if reason:
            skipped[m.pk] = reason
            continue
        lane = lanes.get(number_id) or lanes.setdefault(number_id, _Lane(numbers[number_id], []))
        lane.items.append((m, _template_message(campaign, m, body)))
    return messages, skipped, list(lanes.values())


def _senders(campaign: Campaign, messages: list[WhatsappMessage]) -> dict[int, WhatsappNumber]:
    """The numbers the messages go from, by id. A message without one (older than the choice), or
    whose number was deleted since the fan-out, goes from the campaign's number."""
    own = campaign.whatsapp_number
    assert own is not None
    wanted = {m.whatsapp_number_id for m in messages} - {None, own.pk}
    numbers = {own.pk: own, **WhatsappNumber.objects.select_related("store").in_bulk(list(wanted))}
    for m in messages:
        if m.whatsapp_number_id not in numbers:
            m.whatsapp_number_id = own.pk
    return numbers


def store_names(numbers: dict[int, WhatsappNumber]) -> dict[int, str]:
    """{{store_name}} by sending number: its own store, else the first store that sends from it."""
    names = {pk: n.store.name for pk, n in numbers.items() if n.store}
    others = [pk for pk in numbers if pk not in names]
    if others:
        sending = Store.objects.filter(whatsapp_number_id__in=others).order_by("-pk")
        names.update(sending.values_list("whatsapp_number_id", "name"))  # the lowest pk comes last
    return names


def _skip_reason(m: WhatsappMessage, capped: dict[int, str]) -> str:
    """Why the message must not go to its customer now, or "": consent, a valid phone (the message
    takes its E.164 form), the contact caps."""
    customer = m.customer
    if not customer.marketing_consent:
        return caps.NO_CONSENT
    if not customer.can_receive_whatsapp:
        return "customer opted out or has no phone"
    phone = normalize_phone(customer.phone)
    if phone is None:
        return f"invalid phone number {customer.phone!r}"
    m.phone = phone
    if m.customer_id in capped:
        return capped[m.customer_id]
    return ""


def _empty_variable(campaign: Campaign, body: list[str]) -> str:
    """Meta refuses a template with an empty variable (131008): the first one's reason, or ""."""
    empty = [i + 1 for i, v in enumerate(body) if not v]
    if not empty:
        return ""
    return f"empty template variable {{{{{empty[0]}}}}} ({campaign.template_variables[empty[0] - 1]})"


def _template_message(campaign: Campaign, m: WhatsappMessage, body: list[str]) -> TemplateMessage:
    """The template as Meta takes it for this message: body values, header image, URL buttons."""
    return template_message(
        campaign,
        to=m.phone,
        body=body,
        links={"r": _link("r", m), "u": _link("u", m)},
        callback=f"m:{m.pk}",
    )


def template_message(
    campaign: Campaign, *, to: str, body: list[str], links: dict[str, str], callback: str
) -> TemplateMessage:
    """The campaign's template as Meta takes it, to `to` (E.164): body values, header image, its URL
    buttons ending in `links["r"]` (redirect) and `links["u"]` (unsubscribe). A campaign message's
    and a test send's (campaigns.test_sends) are the same."""
    buttons = []
    if campaign.redirect_button_index is not None:
        buttons.append(UrlButton(campaign.redirect_button_index, links["r"]))
    if campaign.unsubscribe_button_index is not None:
        buttons.append(UrlButton(campaign.unsubscribe_button_index, links["u"]))
    return TemplateMessage(
        to=to.lstrip("+"),
        template=campaign.template_name,
        language=campaign.template_language,
        body=body,
        header_image_url=campaign.header_image_url,
        buttons=buttons,
        biz_opaque_callback_data=callback,
    )


# --- Pacing and send -----------------------------------------------------------------------------


def _book_lanes(lanes: list[_Lane], *, claimed: list[int]) -> tuple[set[int], float | None]:
    """Each lane's credentials, client and pacing slots, booked up to the pacing horizon. A lane's
    messages beyond it go back to QUEUED: they wait in the database, not in a sleeping worker, and
    the job sends the others' and comes back for them. Returns their ids and how long until the
    first of them may go (None when none wait). Should anything fail here nothing was sent: every
    claimed message is released, its attempt not spent, and the error raised for RQ to retry."""
    if not lanes:
        return set(), None
    horizon = _pace_horizon(lanes)
    try:
        for lane in lanes:
            _prepare(lane, within=horizon)
    except Exception:
        _release(claimed)
        raise
    held: list[int] = []
    waits: list[float] = []
    for lane in lanes:
        booked = lane.slots.booked(len(lane.items))
        if booked < len(lane.items):
            held += [m.pk for m, _ in lane.items[booked:]]
            waits.append(max(0.5, lane.slots.free_in - horizon))
        lane.items = lane.items[:booked]
    _release(held)
    return set(held), min(waits, default=None)


def _pace_horizon(lanes: list[_Lane]) -> float:
    """How far ahead each number books its pacing slots: WHATSAPP_PACE_WINDOW; when paced numbers
    share the batch, until a second after the first of them would be done with its share, its
    wait for the slots other jobs booked before counted: a batch's shares take about as long
    (services.batch_shares) and jobs that run side by side book one after the other, while a number
    whose schedule is further ahead, or whose share is out of proportion, keeps neither the job
    nor the others' next messages waiting."""
    window = float(settings.WHATSAPP_PACE_WINDOW)
    paced = [lane for lane in lanes if lane.number.messages_per_second]
    if len(paced) < 2:
        return window
    waits = ratelimit.free_in([pacing.whatsapp_key(lane.number.pk) for lane in paced])
    done = [
        wait + len(lane.items) / lane.number.messages_per_second
        for wait, lane in zip(waits, paced, strict=True)
    ]
    return min(window, 1.0 + min(done))


def _prepare(lane: _Lane, *, within: float) -> None:
    """Credentials (fresh from the database, decrypted in memory only), client and pacing slots."""
    number = lane.number
    lane.token = number.get_access_token()
    lane.client = graph_client(number.graph_url or settings.WHATSAPP_GRAPH_URL)
    lane.slots = ratelimit.reserve(
        pacing.whatsapp_key(number.pk), len(lane.items), number.messages_per_second, within=within
    )


def batch_send(lanes: list[_Lane]) -> concurrent.futures.Future[list[Outcome]] | None:
    """Every lane's messages handed to Meta on the process's event loop, no transaction open;
    returns at once (None with no lane), its result one outcome per message (`_land` takes it)."""
    return aio.start(_send_all(lanes)) if lanes else None


async def _send_all(lanes: list[_Lane]) -> list[Outcome]:
    """Every lane's messages concurrently, each lane on its own number's slots: a slow number's
    pacing never holds up another's sends."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def one(lane: _Lane, i: int, message: WhatsappMessage, payload: TemplateMessage) -> Outcome:
        wait = lane.slots.offset(i) - (loop.time() - started)
        if wait > 0:
            await asyncio.sleep(wait)
        assert lane.client is not None
        result = await lane.client.send_template(
            phone_number_id=lane.number.phone_number_id, access_token=lane.token, message=payload
        )
        return Outcome(
            message_id=message.pk,
            customer_id=message.customer_id,
            number_id=lane.number.pk,
            attempts=message.attempts,
            phone=message.phone,
            result=result,
        )

    return list(
        await asyncio.gather(*(one(lane, i, m, p) for lane in lanes for i, (m, p) in enumerate(lane.items)))
    )


def _prices(campaign: Campaign) -> dict[str, Decimal]:
    """The rate card's prices of the campaign's category in the currency of its cost total (the
    card's when it started): a card changed to another currency since prices nothing, so a total
    never adds two currencies."""
    currency = _cost_currency(campaign)
    rows = WhatsappPrice.objects.filter(category=campaign.template_category, currency=currency)
    return dict(rows.values_list("country", "price"))


def _cost_currency(campaign: Campaign) -> str:
    metric = CampaignMetric.objects.filter(campaign_id=campaign.pk).values_list("cost_currency", flat=True)
    return metric.first() or whatsapp_price_currency()


# --- Classify into a plan (pure) -----------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """Meta's answer for one message, with what the plan needs to know of the message."""

    message_id: int
    customer_id: int
    number_id: int  # the number it went from
    attempts: int  # the message's attempts, this one included
    phone: str  # E.164
    result: SendResult


@dataclass(frozen=True)
class Accepted:
    """A message Meta accepted: what is written on it."""

    wamid: str
    wa_id: str
    cost: Decimal | None  # None: its row keeps the cost its status webhook recorded


@dataclass(frozen=True)
class Refused:
    """A message that failed for good: Meta's code and what it said."""

    code: int | None
    reason: str


@dataclass
class BatchPlan:
    """What a batch's outcomes call for, by message id (each in one group at most), and for the
    customers, the organization and its numbers."""

    sent: dict[int, Accepted] = field(default_factory=dict)
    failed: dict[int, Refused] = field(default_factory=dict)
    unknown: dict[int, str] = field(default_factory=dict)  # Meta may have accepted it: never resent
    skipped: dict[int, str] = field(default_factory=dict)
    retry: list[int] = field(default_factory=list)  # back to QUEUED for another attempt
    release: list[int] = field(default_factory=list)  # back to QUEUED, the attempt given back
    # Accepted, but its status webhook moved it on first (and counted it as sent): only what the
    # send alone knows (wa_id, phone, the cost not yet counted) is written. Set by `reconciled`.
    settled: dict[int, Accepted] = field(default_factory=dict)
    opt_out: list[int] = field(default_factory=list)  # customers who stopped marketing (Meta 131050)
    stop_campaign: str = ""  # the template itself is broken: why
    pause_organization: str = ""  # the business account is unusable: why
    pause_numbers: dict[int, str] = field(default_factory=dict)  # number id -> why Meta refused it
    retry_after: float = 0.0  # the longest Retry-After Meta (or a proxy in front of it) asked for

    @property
    def cost(self) -> Decimal:
        """What the messages written as sent cost, not counted yet."""
        accepted = [*self.sent.values(), *self.settled.values()]
        return sum((a.cost for a in accepted if a.cost is not None), Decimal("0"))

    @property
    def delay(self) -> float | None:
        """How long the batch waits before its next run, None when nothing waits: a paused account
        or number longest, then a throttle, then a retry, never sooner than Meta asked."""
        if self.pause_organization or self.pause_numbers:
            return PAUSED_DELAY * 2
        if self.release:
            return max(THROTTLE_DELAY, self.retry_after)
        if self.retry:
            return max(RETRY_BACKOFF, self.retry_after)
        return None

    @property
    def counts(self) -> dict[str, int]:
        return {
            "sent": len(self.sent),
            "failed": len(self.failed),
            "unknown": len(self.unknown),
            "skipped": len(self.skipped),
            "retry": len(self.retry),
            "throttled": len(self.release),
        }

    def reconciled(self, current: dict[int, str], priced: set[int]) -> BatchPlan:
        """The plan over the rows as they are now (`current`: status by id; `priced`: the ids whose
        row holds a cost). A status webhook may have settled some while the batch was in flight
        (Meta answers statuses fast, a paced batch takes seconds): only rows still SENDING are
        written, so a delivered/read is never undone nor a send counted twice, and an accepted one
        the webhook moved on is `settled`, keeping the cost the webhook counted. The customers',
        organization's and numbers' part stands as it is."""
        pending = {pk for pk, status in current.items() if status == Status.SENDING}
        settled = {
            pk: replace(a, cost=None) if pk in priced else a
            for pk, a in self.sent.items()
            if current.get(pk) in _WEBHOOK_SETTLED
        }
        return replace(
            self,
            sent={pk: a for pk, a in self.sent.items() if pk in pending},
            failed={pk: r for pk, r in self.failed.items() if pk in pending},
            unknown={pk: r for pk, r in self.unknown.items() if pk in pending},
            skipped={pk: r for pk, r in self.skipped.items() if pk in pending},
            retry=[pk for pk in self.retry if pk in pending],
            release=[pk for pk in self.release if pk in pending],
            settled=settled,
        )


def batch_classify(
    outcomes: list[Outcome], *, skipped: dict[int, str], prices: dict[str, Decimal]
) -> BatchPlan:
    """The plan for Meta's answers, and for the messages skipped before any send (id -> reason).
    Pure: plain values in, the plan out. A sent message costs its country's price on `prices` (the
    template category's rate card), else the "*" one, else 0."""
    plan = BatchPlan(skipped=dict(skipped))
    for o in outcomes:
        r = o.result
        if r.ok:
            cost = prices.get(phone_region(o.phone), prices.get("*", Decimal("0")))
            plan.sent[o.message_id] = Accepted(wamid=r.wamid, wa_id=r.wa_id, cost=cost)
        else:
            _classify_refusal(plan, o)
    return plan


def _classify_refusal(plan: BatchPlan, o: Outcome) -> None:
    """Meta's error, as every sender decides it (messaging.decisions.whatsapp), into the plan. An
    unknown outcome is never resent and never "failed": a late status webhook settles it
    (campaigns.statuses)."""
    r = o.result
    assert r.error is not None
    plan.retry_after = max(plan.retry_after, r.retry_after or 0.0)
    decision = decisions.whatsapp(r, attempts=o.attempts, max_attempts=ATTEMPTS)
    if decision.verdict is Verdict.UNKNOWN:
        plan.unknown[o.message_id] = decision.reason
    elif decision.verdict is Verdict.RELEASE:
        plan.release.append(o.message_id)
        if decision.pause_organization:
            plan.pause_organization = decision.pause_organization
        if decision.pause_number:
            plan.pause_numbers[o.number_id] = decision.pause_number
    elif decision.verdict is Verdict.RETRY:
        plan.retry.append(o.message_id)
    else:
        if decision.opt_out:
            plan.opt_out.append(o.customer_id)
        if decision.stop_campaign:
            plan.stop_campaign = decision.stop_campaign
        plan.failed[o.message_id] = Refused(code=r.error.code, reason=decision.reason)


# --- Apply the plan ------------------------------------------------------------------------------


def batch_apply(campaign: Campaign, plan: BatchPlan, messages: list[WhatsappMessage]) -> BatchPlan:
    """Write the plan over `messages` (the batch's claimed ones still held) in one transaction of
    bulk statements, the rows locked and only those still SENDING written (`BatchPlan.reconciled`),
    the campaign's metrics with F(), the customers' opt-outs, the pauses and the sent messages'
    copies for Chatwoot; then stop a campaign whose template is broken. Returns the plan as written."""
    with transaction.atomic():
        rows = (
            WhatsappMessage.objects.select_for_update()
            .filter(id__in=[m.pk for m in messages])
            .values_list("id", "status", "cost")
        )
        current: dict[int, str] = {}
        priced: set[int] = set()
        for pk, status, cost in rows:
            current[pk] = status
            if cost:
                priced.add(pk)
        plan = plan.reconciled(current, priced)
        _write_messages(plan, {m.pk: m for m in messages}, _cost_currency(campaign))
        if plan.retry:
            WhatsappMessage.objects.filter(id__in=plan.retry).update(status=Status.QUEUED, sending_at=None)
        _release(plan.release)
        CampaignMetric.objects.filter(campaign_id=campaign.pk).update(
            sent=F("sent") + len(plan.sent),
            failed=F("failed") + len(plan.failed),
            unknown=F("unknown") + len(plan.unknown),
            skipped=F("skipped") + len(plan.skipped),
            cost=F("cost") + plan.cost,
        )
        _write_sending_state(campaign, plan)
        if plan.sent:
            _mirror_to_chatwoot(campaign, list(plan.sent))
    if plan.stop_campaign:
        services.campaign_stop(campaign_id=campaign.pk, reason=plan.stop_campaign)
    return plan


def _write_messages(plan: BatchPlan, by_id: dict[int, WhatsappMessage], currency: str) -> None:
    """The plan's messages in a few bulk statements, each writing the phone's E.164 form too, and a
    cost with its currency."""
    now = timezone.now()
    sending = {"status": Status.SENDING}
    settled = plan.settled.items()
    _update(by_id, {pk: {"wa_id": a.wa_id} for pk, a in settled if a.cost is None})
    _update(
        by_id,
        {
            pk: {"wa_id": a.wa_id, "cost": a.cost, "cost_currency": currency}
            for pk, a in settled
            if a.cost is not None
        },
    )
    sent = {
        pk: {
            "status": Status.SENT,
            "wamid": a.wamid,
            "wa_id": a.wa_id,
            "sent_at": now,
            "cost": a.cost,
            "cost_currency": currency if a.cost is not None else "",
        }
        for pk, a in plan.sent.items()
    }
    _update(by_id, sent, only_if=sending)
    failed = {
        pk: {"status": Status.FAILED, "error_code": r.code, "error_reason": r.reason, "failed_at": now}
        for pk, r in plan.failed.items()
    }
    _update(by_id, failed, only_if=sending)
    skipped = {pk: {"status": Status.SKIPPED, "error_reason": reason} for pk, reason in plan.skipped.items()}
    _update(by_id, skipped, only_if=sending)
    unknown = {pk: {"status": Status.UNKNOWN, "error_reason": reason} for pk, reason in plan.unknown.items()}
    _update(by_id, unknown, only_if=sending)


def _update(
    by_id: dict[int, WhatsappMessage],
    changes: dict[int, dict[str, Any]],
    *,
    only_if: dict[str, Any] | None = None,
) -> None:
    """Set `changes` (the same fields for every message) on the messages and write them with the phone."""
    if not changes:
        return
    for pk, values in changes.items():
        for name, value in values.items():
            setattr(by_id[pk], name, value)
    fields = [*next(iter(changes.values())), "phone"]
    bulk.update_rows(WhatsappMessage, [by_id[pk] for pk in changes], fields, only_if=only_if)


def _write_sending_state(campaign: Campaign, plan: BatchPlan) -> None:
    """The customers who stopped marketing opted out; the organization or its numbers Meta refused
    paused (crm.services, integrations.services)."""
    if plan.opt_out:
        customers_opt_out(customer_ids=plan.opt_out, channel="whatsapp", source=OptOutSource.PROVIDER)
    if plan.pause_organization:
        organizations_pause(
            organization_ids=[campaign.organization_id], channel="whatsapp", reason=plan.pause_organization
        )
    for number_id, reason in plan.pause_numbers.items():
        whatsapp_numbers_pause(
            organization_id=campaign.organization_id, number_ids=[number_id], reason=reason
        )


def _mirror_to_chatwoot(campaign: Campaign, message_ids: list[int]) -> None:
    """The sent messages' copies for Chatwoot, in the batch's transaction (so a worker killed after
    the commit loses no mirror) but in a savepoint of their own: nothing in making them (a bug) may
    fail a batch whose sends are recorded, so any error is logged and dropped. Their push is
    enqueued after the commit."""
    try:
        from campaigns import chatwoot

        with transaction.atomic():
            chatwoot.chatwoot_enqueue_mirror(campaign_id=campaign.pk, message_ids=message_ids)
    except Exception:
        logger.exception(
            "campaign %s: Chatwoot mirror not enqueued",
            campaign.pk,
            extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
        )
