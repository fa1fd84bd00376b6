"""Sending one batch of WhatsApp messages: the seed's 12 steps, for many messages at once.

1 credentials fresh from the database · 2 phone to E.164 · 3 organization settings · 4 per-customer
limit · 5 conflict block · 6 template variables as Meta takes them (integrations.whatsapp.parameters:
no new-line, tab or run of spaces, 132018 prevented) and none empty (131008 prevented) · 7 components ·
8 Meta Graph call · 9 SENT + metric · 10 cost · 11 Chatwoot mirror (its own job) · 12 completion.

Exactly once: messages are claimed (QUEUED -> SENDING) in the database before Meta is called, so
a retry, a second worker or a re-run after a crash only ever sees the ones still QUEUED.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from campaigns import caps, links, services
from campaigns.models import Campaign, CampaignMetric, WhatsappMessage
from crm import aio, bulk, ratelimit
from crm.jobs import Defer
from crm.models import Customer, OptOutSource, Organization, Store
from crm.names import first_name
from integrations.clients import graph_client
from integrations.models import WhatsappNumber, WhatsappPrice
from integrations.whatsapp.client import GraphClient, SendResult, TemplateMessage, UrlButton
from integrations.whatsapp.errors import Action
from integrations.whatsapp.parameters import template_text
from integrations.whatsapp.phones import normalize_phone, phone_region

logger = logging.getLogger(__name__)

Status = WhatsappMessage.Status
ATTEMPTS = 2  # the seed: 2 attempts, exponential backoff from 1 s
RETRY_BACKOFF = 1.0
THROTTLE_DELAY = 5.0
PAUSED_DELAY = services.PAUSED_DELAY


def _variable(customer: Customer, source: str, store_name: str) -> str:
    if source == "first_name":
        return first_name(customer.name or "")
    if source == "name":
        return customer.name or ""
    if source == "email":
        return customer.email or ""
    if source == "store_name":
        return store_name
    return ""


def template_values(*, customer: Customer, sources: list[str], store_name: str) -> list[str]:
    """The template's body values for a customer, as Meta gets them (folded white space, its length
    limit: integrations.whatsapp.parameters); "" for one that is empty."""
    return [template_text(_variable(customer, source, store_name)) for source in sources]


def _link(kind: str, message: WhatsappMessage) -> str:
    # A template's URL button ends in a variable ("https://<our host>/{{1}}"). The seed put a
    # __REDIRECT_URL__ sentinel there and replaced it per message; the value here is the
    # message's signed redirect ("r/…") or unsubscribe ("u/…") path on our own host.
    return links.link_path(kind, message)


@dataclass
class _Outcome:
    message: WhatsappMessage
    result: SendResult
    number_id: int


@dataclass
class _Lane:
    """One sending number's share of a batch: its credentials, its pacing slots, its messages."""

    number: WhatsappNumber
    items: list[tuple[WhatsappMessage, TemplateMessage]]
    token: str = ""
    client: GraphClient | None = None
    slots: ratelimit.Slots = field(default_factory=lambda: ratelimit.Slots(0.0, 0.0))


def _claim(campaign_id: int, batch: int, *, paused: Q | None = None) -> list[int]:
    with transaction.atomic():
        queued = WhatsappMessage.objects.select_for_update(skip_locked=True).filter(
            campaign_id=campaign_id, batch=batch, status=Status.QUEUED
        )
        if paused is not None:
            queued = queued.exclude(paused)
        ids = list(queued.values_list("id", flat=True))
        if ids:
            WhatsappMessage.objects.filter(id__in=ids).update(
                status=Status.SENDING, attempts=F("attempts") + 1, sending_at=timezone.now()
            )
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


async def _send_all(lanes: list[_Lane]) -> list[_Outcome]:
    """Every lane's messages concurrently, each lane on its own number's slots: a slow number's
    pacing never holds up another's sends."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def one(lane: _Lane, i: int, message: WhatsappMessage, payload: TemplateMessage) -> _Outcome:
        wait = lane.slots.offset(i) - (loop.time() - started)
        if wait > 0:
            await asyncio.sleep(wait)
        assert lane.client is not None
        result = await lane.client.send_template(
            phone_number_id=lane.number.phone_number_id, access_token=lane.token, message=payload
        )
        return _Outcome(message, result, lane.number.pk)

    return list(
        await asyncio.gather(*(one(lane, i, m, p) for lane in lanes for i, (m, p) in enumerate(lane.items)))
    )


def _prices(category: str) -> dict[str, Decimal]:
    return dict(WhatsappPrice.objects.filter(category=category).values_list("country", "price"))


def whatsapp_send_batch(*, campaign_id: int, batch: int) -> dict[str, int]:
    """Send every still-queued message of one batch. Returns counts by outcome.

    Raises Defer (no attempt spent) while the campaign is paused, the organization's sending is
    paused, messages wait for their paused number, for their number's pacing (beyond
    WHATSAPP_PACE_WINDOW), or for a retry or a throttle to pass.
    """
    campaign = Campaign.objects.select_related(
        "organization", "whatsapp_number", "whatsapp_number__store"
    ).get(pk=campaign_id)
    org: Organization = campaign.organization
    if not services.batch_may_send(campaign=campaign, batch=batch):
        return {}

    paused = paused_numbers(organization_id=org.pk)
    of_paused = _of_paused(campaign, paused)
    ids = _claim(campaign_id, batch, paused=of_paused)
    if not ids:
        _defer_while_paused(campaign_id, batch, of_paused, paused)
        services.campaign_complete_if_done(campaign_id=campaign_id)
        return {}
    messages = list(WhatsappMessage.objects.filter(id__in=ids).select_related("customer").order_by("id"))
    services.skip_without_customer(model=WhatsappMessage, campaign_id=campaign_id, ids=ids, found=messages)
    numbers = _senders(campaign, messages)
    skipped, lanes = _eligible(campaign, org, messages, numbers)
    counts: Counter[str] = Counter()

    outcomes: list[_Outcome] = []
    pace_wait: float | None = None
    if lanes:
        horizon = _pace_horizon(lanes)
        try:
            for lane in lanes:
                _prepare(lane, within=horizon)
        except Exception:
            # Nothing was sent yet: give the claims back (attempt not spent) and let RQ retry.
            _release(ids)
            raise
        # A number's messages beyond the horizon of its pacing wait in the database, not in a
        # sleeping worker: the job sends the others' and comes back for them.
        held: list[WhatsappMessage] = []
        for lane in lanes:
            booked = lane.slots.booked(len(lane.items))
            held += [m for m, _ in lane.items[booked:]]
            if booked < len(lane.items):
                wait = max(0.5, lane.slots.free_in - horizon)
                pace_wait = wait if pace_wait is None else min(pace_wait, wait)
            lane.items = lane.items[:booked]
        if held:
            _release([m.pk for m in held])
            gone = {m.pk for m in held}
            messages = [m for m in messages if m.pk not in gone]
            lanes = [lane for lane in lanes if lane.items]
        started = time.monotonic()
        outcomes = aio.run(_send_all(lanes))
        for lane in lanes:
            lane.token = ""
        logger.info(
            "batch %s/%s: %s sends from %s number(s) in %.2fs",
            campaign_id,
            batch,
            len(outcomes),
            len(lanes),
            time.monotonic() - started,
            extra={"campaign_id": campaign_id, "organization_id": org.pk},
        )
    retry_in = _record(campaign, messages, skipped, outcomes, counts)
    delays = [d for d in (retry_in, pace_wait) if d is not None]
    if delays:
        # Before the batches queued meanwhile: its numbers' next slots are its own.
        raise Defer(
            min(delays), "messages wait for a retry, a throttle or their number's pacing", at_front=True
        )
    _defer_while_paused(campaign_id, batch, of_paused, paused)
    services.campaign_complete_if_done(campaign_id=campaign_id)
    return dict(counts)


def _defer_while_paused(campaign_id: int, batch: int, of_paused: Q | None, paused: dict[int, str]) -> None:
    """Raise Defer while messages of this batch wait for a paused number (an operator resumes it)."""
    if of_paused is None:
        return
    queued = WhatsappMessage.objects.filter(campaign_id=campaign_id, batch=batch, status=Status.QUEUED)
    if queued.filter(of_paused).exists():
        reasons = "; ".join(sorted(set(paused.values())))[:200]
        raise Defer(PAUSED_DELAY * 2, f"WhatsApp number paused: {reasons}")


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


def _store_names(numbers: dict[int, WhatsappNumber]) -> dict[int, str]:
    """{{store_name}} by sending number: its own store, else the first store that sends from it."""
    names = {pk: n.store.name for pk, n in numbers.items() if n.store}
    others = [pk for pk in numbers if pk not in names]
    if others:
        sending = Store.objects.filter(whatsapp_number_id__in=others).order_by("-pk")
        names.update(sending.values_list("whatsapp_number_id", "name"))  # the lowest pk comes last
    return names


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
    waits = ratelimit.free_in([f"wa:{lane.number.pk}" for lane in paced])
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
        f"wa:{number.pk}", len(lane.items), number.messages_per_second, within=within
    )


def _eligible(
    campaign: Campaign, org: Organization, messages: list[WhatsappMessage], numbers: dict[int, WhatsappNumber]
) -> tuple[dict[int, str], list[_Lane]]:
    """The seed's checks in bulk: (messages skipped with their reason, the rest by sending number)."""
    now = timezone.now()
    customer_ids = [m.customer_id for m in messages]
    skipped: dict[int, str] = {}

    # 4, 5. the contact caps (campaigns.caps): time has passed since the fan-out applied them
    capped = caps.skip_reasons(campaign=campaign, customer_ids=customer_ids, now=now)

    store_names = _store_names(numbers)
    lanes: dict[int, _Lane] = {}
    for m in messages:
        customer = m.customer
        if not customer.can_receive_whatsapp:
            skipped[m.pk] = "customer opted out or has no consent"
            continue
        phone = normalize_phone(customer.phone)  # 2
        if phone is None:
            skipped[m.pk] = f"invalid phone number {customer.phone!r}"
            continue
        m.phone = phone
        if m.customer_id in capped:
            skipped[m.pk] = capped[m.customer_id]
            continue
        # 6: each value as Meta takes it (folded white space, its length limit), then none empty
        number_id = m.whatsapp_number_id
        assert number_id is not None  # _senders gave every message one
        body = template_values(
            customer=customer, sources=campaign.template_variables, store_name=store_names.get(number_id, "")
        )
        empty = [i + 1 for i, v in enumerate(body) if not v]
        if empty:
            skipped[m.pk] = (
                f"empty template variable {{{{{empty[0]}}}}} ({campaign.template_variables[empty[0] - 1]})"
            )
            continue
        buttons = []  # 7
        if campaign.redirect_button_index is not None:
            buttons.append(UrlButton(campaign.redirect_button_index, _link("r", m)))
        if campaign.unsubscribe_button_index is not None:
            buttons.append(UrlButton(campaign.unsubscribe_button_index, _link("u", m)))
        lane = lanes.get(number_id) or lanes.setdefault(number_id, _Lane(numbers[number_id], []))
        lane.items.append(
            (
                m,
                TemplateMessage(
                    to=phone.lstrip("+"),
                    template=campaign.template_name,
                    language=campaign.template_language,
                    body=body,
                    header_image_url=campaign.header_image_url,
                    buttons=buttons,
                    biz_opaque_callback_data=f"m:{m.pk}",
                ),
            )
        )
    return skipped, list(lanes.values())


def _record(
    campaign: Campaign,
    messages: list[WhatsappMessage],
    skipped: dict[int, str],
    outcomes: list[_Outcome],
    counts: Counter[str],
) -> float | None:
    """Write every outcome in a few bulk statements; returns the delay before a retry, if any."""
    now = timezone.now()
    by_id = {m.pk: m for m in messages}
    prices = _prices(campaign.template_category) if outcomes else {}
    sent: list[WhatsappMessage] = []
    failed: list[WhatsappMessage] = []
    unknown: list[WhatsappMessage] = []  # out of attempts, but Meta may have accepted the last one
    requeue_spent: list[int] = []
    requeue_free: list[int] = []
    opt_outs: list[int] = []
    stop_campaign: str | None = None
    stop_org: str | None = None
    pause_numbers: dict[int, str] = {}  # number id -> Meta's reason
    asked = 0.0  # the longest Retry-After Meta (or a proxy in front of it) asked for
    cost = Decimal("0")
    for o in outcomes:
        m, r = o.message, o.result
        if r.ok:
            m.status, m.wamid, m.wa_id, m.sent_at = Status.SENT, r.wamid, r.wa_id, now
            region = phone_region(m.phone)
            m.cost = prices.get(region, prices.get("*", Decimal("0")))
            cost += m.cost
            sent.append(m)
            continue
        assert r.error is not None
        asked = max(asked, r.retry_after or 0.0)
        action = r.action
        if r.maybe_accepted and action == Action.RETRY:
            # The request went out and no answer came back (a timeout, a connection broken after
            # the write): Meta may have accepted it, and its API takes no idempotency key, so a
            # resend could reach the customer twice. Never resent, never "failed": a late status
            # webhook settles it (campaigns.statuses).
            m.status, m.error_reason = Status.UNKNOWN, f"outcome unknown: {r.error.message}; not resent"
            unknown.append(m)
        elif action == Action.THROTTLED:
            requeue_free.append(m.pk)
        elif action == Action.RETRY and m.attempts < ATTEMPTS:
            requeue_spent.append(m.pk)
        elif action == Action.STOP_ORGANIZATION:
            requeue_free.append(m.pk)
            stop_org = str(r.error)
        elif action == Action.PAUSE_NUMBER:
            requeue_free.append(m.pk)
            pause_numbers[o.number_id] = str(r.error)
        else:
            if action == Action.OPT_OUT:
                opt_outs.append(m.customer_id)
            if action == Action.STOP_CAMPAIGN:
                stop_campaign = str(r.error)
            m.status, m.error_code, m.error_reason, m.failed_at = (
                Status.FAILED,
                r.error.code,
                (r.error.message + (f" — {r.error.details}" if r.error.details else ""))[:2000],
                now,
            )
            failed.append(m)
    skip_rows = []
    for pk, reason in skipped.items():
        m = by_id[pk]
        m.status, m.error_reason = Status.SKIPPED, reason
        skip_rows.append(m)
    with transaction.atomic():
        # A status webhook may have settled some of these while the batch was in flight (Meta
        # answers statuses fast, a paced batch takes seconds): lock the rows and write only the
        # ones still SENDING, so a delivered/read is never undone nor a send counted twice.
        rows = list(
            WhatsappMessage.objects.select_for_update()
            .filter(id__in=[m.pk for m in messages])
            .values_list("id", "status", "cost")
        )
        current = {pk: status for pk, status, _ in rows}
        priced = {pk for pk, _, row_cost in rows if row_cost}
        pending = {pk for pk, status in current.items() if status == Status.SENDING}
        # Accepted by Meta but already moved forward by its status webhook (which counted them as
        # sent, and their cost when its pricing block said it): only what the send alone knows
        # (wa_id, phone, and the cost not yet counted) is still to be written.
        settled = [m for m in sent if current.get(m.pk) in (Status.SENT, Status.DELIVERED, Status.READ)]
        for m in settled:
            if m.pk in priced:
                m.cost = Decimal("0")  # counted by the webhook; the row keeps the webhook's cost
        sent = [m for m in sent if m.pk in pending]
        failed = [m for m in failed if m.pk in pending]
        unknown = [m for m in unknown if m.pk in pending]
        skip_rows = [m for m in skip_rows if m.pk in pending]
        requeue_spent = [pk for pk in requeue_spent if pk in pending]
        requeue_free = [pk for pk in requeue_free if pk in pending]
        cost = sum((m.cost for m in sent + settled), Decimal("0"))
        bulk.update_rows(WhatsappMessage, [m for m in settled if m.pk in priced], ["wa_id", "phone"])
        bulk.update_rows(
            WhatsappMessage, [m for m in settled if m.pk not in priced], ["wa_id", "cost", "phone"]
        )
        guard = {"status": Status.SENDING}
        bulk.update_rows(
            WhatsappMessage, sent, ["status", "wamid", "wa_id", "sent_at", "cost", "phone"], only_if=guard
        )
        bulk.update_rows(
            WhatsappMessage,
            failed,
            ["status", "error_code", "error_reason", "failed_at", "phone"],
            only_if=guard,
        )
        bulk.update_rows(WhatsappMessage, skip_rows, ["status", "error_reason", "phone"], only_if=guard)
        bulk.update_rows(WhatsappMessage, unknown, ["status", "error_reason", "phone"], only_if=guard)
        if requeue_spent:
            WhatsappMessage.objects.filter(id__in=requeue_spent).update(status=Status.QUEUED, sending_at=None)
        if requeue_free:
            WhatsappMessage.objects.filter(id__in=requeue_free).update(
                status=Status.QUEUED, sending_at=None, attempts=F("attempts") - 1
            )
        CampaignMetric.objects.filter(campaign_id=campaign.pk).update(
            sent=F("sent") + len(sent),
            failed=F("failed") + len(failed),
            unknown=F("unknown") + len(unknown),
            skipped=F("skipped") + len(skip_rows),
            cost=F("cost") + cost,
        )
        if opt_outs:
            Customer.objects.filter(id__in=opt_outs, whatsapp_opted_out_at__isnull=True).update(
                whatsapp_opted_out_at=now, whatsapp_opt_out_source=OptOutSource.PROVIDER, updated_at=now
            )
        if stop_org:
            Organization.objects.filter(pk=campaign.organization_id, whatsapp_paused_at__isnull=True).update(
                whatsapp_paused_at=now, whatsapp_paused_reason=stop_org
            )
        for number_id, reason in pause_numbers.items():
            WhatsappNumber.objects.filter(pk=number_id, paused_at__isnull=True).update(
                paused_at=now, paused_reason=reason[:2000]
            )
    if sent:
        # 11: fire-and-forget. The mirror is its own job; nothing in enqueueing it (Redis down, a
        # bug) may fail a batch whose sends are already recorded, so any error is logged and dropped.
        try:
            from campaigns import chatwoot

            chatwoot.chatwoot_enqueue_mirror(campaign_id=campaign.pk, message_ids=[m.pk for m in sent])
        except Exception:
            logger.exception(
                "campaign %s: Chatwoot mirror not enqueued",
                campaign.pk,
                extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
            )
    if stop_campaign:
        services.campaign_stop(campaign_id=campaign.pk, reason=stop_campaign)
    counts.update(
        sent=len(sent),
        failed=len(failed),
        unknown=len(unknown),
        skipped=len(skip_rows),
        retry=len(requeue_spent),
        throttled=len(requeue_free),
    )
    for number_id, reason in pause_numbers.items():
        logger.error(
            "WhatsApp number %s paused: %s",
            number_id,
            reason,
            extra={"organization_id": campaign.organization_id, "campaign_id": campaign.pk},
        )
    if stop_org:
        logger.error(
            "organization %s: WhatsApp sending paused: %s",
            campaign.organization_id,
            stop_org,
            extra={"organization_id": campaign.organization_id},
        )
    if stop_org or pause_numbers:
        return PAUSED_DELAY * 2
    if requeue_free:
        return max(THROTTLE_DELAY, asked)
    if requeue_spent:
        return max(RETRY_BACKOFF, asked)
    return None
