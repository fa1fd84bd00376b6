"""Sending one batch of WhatsApp messages: the seed's send job, for many messages at once.

`whatsapp_send_batch` claims the batch's queued messages and runs them through named steps:

- `batch_eligible`: who may receive it now (consent, a phone in E.164, the contact caps checked
  again at send time, template values as Meta takes them: integrations.whatsapp.parameters folds
  new-lines, tabs and runs of spaces (132018 prevented) and none may be empty (131008 prevented)),
  the rest grouped by the number they go from, each with its template message and URL buttons.
- `_book_lanes`: each number's credentials, fresh from the database and decrypted in memory only,
  and its pacing slots; the messages beyond the pacing horizon go back to QUEUED and wait.
- `batch_send`: the Graph API calls, every number's concurrently, no transaction open, started on
  the process's event loop: while chunks are in flight the job claims the next ones and books
  their slots (`_send_chunks`, up to WHATSAPP_MAX_IN_FLIGHT messages), so neither the worker nor
  a number's schedule idles.
- `batch_classify`: Meta's answers into a `BatchPlan`, pure: which messages are sent (and their
  cost), failed, of unknown outcome, retried or released, which customers opted out, whether the
  organization or a number is paused and why, how long the batch waits.
- `batch_apply`: the plan in one transaction of bulk statements, only over rows still SENDING
  (`BatchPlan.reconciled`), metrics with F(); then the Chatwoot mirror (its own job) and the
  campaign stopped when its template is broken.

The last run of the batch marks the campaign complete. Exactly once: messages are claimed
(QUEUED -> SENDING) in the database before Meta is called, so a retry, a second worker or a re-run
after a crash only ever sees the ones still QUEUED."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from campaigns import chatwoot, lifecycle, lift
from campaigns.models import Campaign, WhatsappMessage
from campaigns.whatsapp.apply import _cost_currency, _release, batch_apply
from campaigns.whatsapp.eligibility import _Lane, batch_eligible
from campaigns.whatsapp.plan import (
    PAUSED_DELAY,
    Outcome,
    batch_classify,
)
from crm import aio, jobs, ratelimit
from crm.jobs import Defer
from integrations.clients import graph_client
from integrations.models import WhatsappNumber, WhatsappPrice
from integrations.whatsapp.client import TemplateMessage
from messaging import pacing

logger = logging.getLogger(__name__)

Status = WhatsappMessage.Status


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
    if not lifecycle.batch_may_send(campaign=campaign, batch=batch):
        return {}
    paused = paused_numbers(organization_id=campaign.organization_id)
    of_paused = _of_paused(campaign, paused)
    counts = _send_chunks(campaign, batch, paused=of_paused)
    _defer_while_paused(campaign_id, batch, of_paused, paused)
    lifecycle.campaign_complete_if_done(campaign_id=campaign_id)
    return counts


@dataclass
class _Flight:
    """A chunk's claimed messages on their way: their sends run on the process's event loop while
    the job goes on (claims and books the next chunk); `_land` takes Meta's answers and writes them."""

    claimed: int
    last_id: int  # the chunk's last message: the next claim starts after it
    messages: list[WhatsappMessage]
    skipped: dict[int, str]
    lanes: list[_Lane]
    pace_wait: float | None  # how long until the messages held beyond the pacing horizon may go
    sends: concurrent.futures.Future[list[Outcome]] | None
    started: float = field(default_factory=time.monotonic)

    @property
    def paced(self) -> bool:
        return any(lane.number.messages_per_second for lane in self.lanes)

    @property
    def pipelines(self) -> bool:
        """Whether a next chunk is claimed (and its slots booked) while this one is in flight:
        every message within the pacing horizon (none waits), paced or not."""
        return bool(settings.WHATSAPP_SEND_PIPELINE) and self.pace_wait is None


def _send_chunks(campaign: Campaign, batch: int, *, paused: Q | None) -> dict[str, int]:
    """The batch's queued messages, a chunk (`_chunk_size`) at a time; returns counts by outcome.
    Raises Defer when some wait for a retry, a throttle or their number's pacing (the rest waits
    too), Yield after a full chunk when another tenant's work waits ahead (the next run takes the
    rest).

    Pipelined: while chunks' sends are in flight, the next ones are claimed (and, paced, their slots
    booked right after them), up to WHATSAPP_MAX_IN_FLIGHT messages (paced, two chunks), so neither
    the worker nor a number's schedule waits for a chunk's last answers (Meta's latency) and its
    writes. The turn is asked before each claim, so work waiting for it waits for the chunks in
    flight, not the batch; every chunk in flight is landed (its answers written, those in together
    with the oldest) before the job defers or yields."""
    counts: dict[str, int] = {}
    rates = _Rates(campaign)
    chunk = _chunk_size(campaign)
    # Paced, two chunks (each a quarter second of the number's rate or more) cover Meta's latency;
    # more would book its schedule seconds ahead, which a yield then waits for.
    unpaced_depth = max(2, int(settings.WHATSAPP_MAX_IN_FLIGHT) // chunk)
    flights: deque[_Flight] = deque()
    last: _Flight | None = None  # the chunk claimed last
    claiming, give_turn = True, False
    while True:
        depth = 2 if any(f.paced for f in flights) else unpaced_depth
        if claiming and (not flights or (len(flights) < depth and flights[-1].pipelines)):
            if last is not None and last.claimed < chunk:
                claiming = False  # a short chunk: nothing more was queued
            elif last is not None and jobs.turn_waits():
                # A full chunk gives its turn when other work waits (crm.jobs.turn_waits).
                claiming, give_turn = False, True
            else:
                try:
                    after = last.last_id if last is not None else 0
                    following = _next_chunk(campaign, batch, paused=paused, limit=chunk, after=after)
                except Exception:
                    _land_all(campaign, batch, flights, counts, rates)  # Meta has them: answers written first
                    raise
                if following is None:
                    claiming = False
                else:
                    flights.append(following)
                    last = following
                continue
        if not flights:
            break
        delays = _land(campaign, batch, _landing(flights), counts, rates)
        if delays:
            _land_all(campaign, batch, flights, counts, rates)
            # Before the batches queued meanwhile: its numbers' next slots are its own.
            raise Defer(
                min(delays), "messages wait for a retry, a throttle or their number's pacing", at_front=True
            )
    if give_turn:
        # Another tenant's batch waiting on this queue (or work on a queue served first) runs now,
        # not after this one: the job goes back to the head of its tenant's list and its next run
        # takes the rest.
        raise jobs.Yield(f"batch {campaign.pk}/{batch}: another tenant's work waits")
    return counts


def _land_all(
    campaign: Campaign, batch: int, flights: deque[_Flight], counts: dict[str, int], rates: _Rates
) -> None:
    """Every chunk still in flight landed (Meta's answers written), in one write."""
    if flights:
        group = list(flights)
        flights.clear()
        _land(campaign, batch, group, counts, rates)


def _landing(flights: deque[_Flight]) -> list[_Flight]:
    """The oldest chunk in flight, its answers waited for, and each after it whose answers are all
    in: written together, one transaction for them all (a job giving its turn, or whose answers
    come at once, writes its chunks in one go, not one by one)."""
    group = [flights.popleft()]
    if group[0].sends is not None:
        concurrent.futures.wait([group[0].sends])
    while flights and (flights[0].sends is None or flights[0].sends.done()):
        group.append(flights.popleft())
    return group


def _chunk_size(campaign: Campaign) -> int:
    """WHATSAPP_SEND_CHUNK messages, or WHATSAPP_SEND_CHUNK_SECONDS of the campaign's number's pacing
    when that is more: the chunks in flight must cover Meta's latency at the number's rate, or its
    schedule idles (two chunks of 100 held a number at 1,000/s to ~850/s at 200 ms; 250 reached it).
    Unpaced chunks stay small: the turn another tenant's work waits for (chunks of 250 sent 1.0x a
    raw loop's requests at 200 ms instead of 0.55x, but a small campaign beside a big one took 2.8x
    its time alone instead of 1.4x; docs/benchmarks.md)."""
    number = campaign.whatsapp_number
    rate = number.messages_per_second if number is not None else 0
    return max(int(settings.WHATSAPP_SEND_CHUNK), int(rate * settings.WHATSAPP_SEND_CHUNK_SECONDS), 1)


def _next_chunk(
    campaign: Campaign, batch: int, *, paused: Q | None, limit: int, after: int
) -> _Flight | None:
    """The batch's next chunk (after message id `after`) claimed, its eligible messages' slots
    booked (those beyond the pacing horizon back to QUEUED) and their sends started; None when
    nothing is left to claim."""
    ids = _claim(campaign.pk, batch, paused=paused, limit=limit, after=after)
    if not ids:
        return None
    messages, skipped, lanes = batch_eligible(campaign=campaign, ids=ids)
    held, pace_wait = _book_lanes(lanes, claimed=ids)
    if held:
        messages = [m for m in messages if m.pk not in held]
        lanes = [lane for lane in lanes if lane.items]
    return _Flight(len(ids), ids[-1], messages, skipped, lanes, pace_wait, batch_send(lanes))


def _land(
    campaign: Campaign, batch: int, group: list[_Flight], counts: dict[str, int], rates: _Rates
) -> list[float]:
    """Meta's answers for chunks in flight, classified and written together, their counts added to
    `counts`; returns how long their messages that wait must (none: [])."""
    outcomes = [o for flight in group if flight.sends is not None for o in flight.sends.result()]
    for flight in group:
        for lane in flight.lanes:
            lane.token = ""
    if outcomes:
        logger.info(
            "batch %s/%s: %s sends from %s number(s) in %.2fs",
            campaign.pk,
            batch,
            len(outcomes),
            len({lane.number.pk for flight in group for lane in flight.lanes}),
            time.monotonic() - group[0].started,
            extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
        )
    skipped = {pk: reason for flight in group for pk, reason in flight.skipped.items()}
    plan = batch_apply(
        campaign,
        batch_classify(outcomes, skipped=skipped, prices=rates.prices if outcomes else {}),
        [m for flight in group for m in flight.messages],
        currency=rates.currency,
        mirrors=rates.mirrors,
    )
    for outcome, n in plan.counts.items():
        counts[outcome] = counts.get(outcome, 0) + n
    return [d for d in (plan.delay, *(flight.pace_wait for flight in group)) if d is not None]


def _claim(
    campaign_id: int, batch: int, *, paused: Q | None = None, limit: int | None = None, after: int = 0
) -> list[int]:
    """Claim (QUEUED -> SENDING) up to `limit` of the batch's queued messages after id `after`, in
    id order: one statement, the rows another claim holds skipped. A run claims past its last
    chunk, so what it released for a later retry (back to QUEUED, behind it) waits for the next run."""
    queued = WhatsappMessage.objects.filter(
        campaign_id=campaign_id, batch=batch, status=Status.QUEUED, id__gt=after
    )
    if paused is not None:
        queued = queued.exclude(paused)
    first = queued.order_by("id").values("id")[:limit]
    table, quote = WhatsappMessage._meta.db_table, connection.ops.quote_name
    select, params = first.query.get_compiler(connection=connection).as_sql()
    # The rows another claim holds skipped (Django compiles select_for_update only in a transaction).
    select += " FOR UPDATE SKIP LOCKED"

    def claim() -> list[int]:
        with connection.cursor() as cursor:
            # ARRAY(…): the locking subquery runs once, whatever plan the UPDATE gets.
            cursor.execute(
                f"UPDATE {quote(table)} SET status = %s, attempts = attempts + 1, sending_at = %s "  # noqa: S608
                f"WHERE id = ANY(ARRAY({select})) RETURNING id",
                [Status.SENDING, timezone.now(), *params],
            )
            return sorted(row[0] for row in cursor.fetchall())

    if after:
        return claim()  # one statement, atomic as it is: no BEGIN and COMMIT round trips a chunk
    with transaction.atomic():
        ids = claim()
        if ids:
            # The batch's control group would have been sent now: its purchase window starts too.
            lift.held_out_stamp(model=WhatsappMessage, campaign_id=campaign_id, batch=batch)
    return ids


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
    (fanout.batch_shares) and jobs that run side by side book one after the other, while a number
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


class _Rates:
    """The campaign's cost currency and its rate card's prices in it, and whether its sends are
    mirrored to Chatwoot, read once per job (at its first answers), not for every chunk."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign

    @functools.cached_property
    def currency(self) -> str:
        return _cost_currency(self.campaign)

    @functools.cached_property
    def mirrors(self) -> bool:
        return chatwoot.chatwoot_enabled(campaign_id=self.campaign.pk)

    @functools.cached_property
    def prices(self) -> dict[str, Decimal]:
        """The prices of the campaign's category in the currency of its cost total (the card's
        when it started): a card changed to another currency since prices nothing, so a total never
        adds two currencies."""
        rows = WhatsappPrice.objects.filter(category=self.campaign.template_category, currency=self.currency)
        return dict(rows.values_list("country", "price"))
