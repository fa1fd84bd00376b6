"""Sending one batch of campaign emails: the seed's email-send job, for many messages at once.

`email_send_batch` claims a few messages at a time and runs each chunk through named steps:
`chunk_eligible` (who may receive it now: consent, suppression, contact caps checked again, a valid
address), `chunk_send` (no transaction open), `chunk_classify` (the outcomes into a `ChunkPlan`,
pure) and `chunk_apply` (one transaction, metrics with F()). What it guarantees:

- Settings are read fresh in the job, the password or API key decrypted in memory only; timeouts
  15 s / 15 s / 30 s (integrations.email.smtp); List-Unsubscribe (https one-click + mailto) and
  List-Unsubscribe-Post.
- Sent: SENT, metrics sent+1 and delivered+1. Failures are classified (integrations.email.bounces):
  hard bounces suppress the address, soft ones are retried (3 attempts, exponential from 60 s),
  policy blocks (5.7.x, blocklists) are BLOCKED and never suppress, sender-side failures pause the
  organization's email and leave the recipients untouched. The last chunk checks for completion.
- The organization's rate is enforced by a limiter in Redis (crm.ratelimit) shared by every worker,
  and a process's SMTP connections (up to EMAIL_CONNECTIONS) are reused across messages and jobs
  (integrations.email.pool).
- Exactly once: messages are claimed (QUEUED -> SENDING) a few at a time before they are handed to
  the server, so a retry, a second worker or a re-run after a crash only ever sees the ones still
  QUEUED; a connection that breaks after the hand-over leaves the message FAILED with "outcome
  unknown", never sent again.
- Or through the organization's ESP (EmailSettings.provider, integrations.email.esp with
  django-anymail): the same claims, limiter and outcomes, the ESP's message id stored for its
  tracking webhooks (campaigns.esp_tracking); an ESP that cannot take messages now (429, 5xx,
  unreachable) releases them and defers the batch, unpaused."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import F, Min, Q
from django.utils import timezone

from campaigns import caps, lifecycle, lift, links
from campaigns.email.content import compiled_email, variables_for
from campaigns.models import (
    OUTCOME_UNKNOWN,
    BounceType,
    Campaign,
    CampaignMetric,
    Channel,
    EmailMessage,
)
from crm import bulk, jobs, ratelimit
from crm.jobs import Defer
from crm.models import Organization
from crm.services import organizations_pause
from integrations.email import esp
from integrations.email.bounces import Failure
from integrations.email.smtp import SmtpServer
from integrations.models import EmailSettings
from messaging import decisions, email_render, pacing, suppression
from messaging.decisions import Verdict
from messaging.email_transport import Delivery, build_message, deliver, email_transport

logger = logging.getLogger(__name__)

Status = EmailMessage.Status
ATTEMPTS = 3  # the seed: 3 attempts, exponential backoff from 60 s (EMAIL_RETRY_BACKOFF)
PAUSED_DELAY = lifecycle.PAUSED_DELAY
# A job sends for at most this long, then yields its worker and continues as a new run (a slow
# organization's rate must not hold a worker past the queue's timeout).
JOB_BUDGET = 60.0


@dataclass
class ChunkPlan:
    """What a chunk's outcomes call for: the messages by the state they are written in."""

    sent: list[EmailMessage] = field(default_factory=list)
    bounced: list[EmailMessage] = field(default_factory=list)
    blocked: list[EmailMessage] = field(default_factory=list)  # refused by policy: the address is kept
    failed: list[EmailMessage] = field(default_factory=list)
    skipped: list[EmailMessage] = field(default_factory=list)
    retry: list[EmailMessage] = field(default_factory=list)  # soft bounce with attempts left
    release: list[int] = field(default_factory=list)  # not handed over: back to QUEUED, attempt not spent
    suppress: list[tuple[str, str]] = field(default_factory=list)
    sender_failure: str = ""
    transient: str = ""  # the ESP cannot take messages now: the rest are released, the batch deferred
    retry_after: float = 0.0  # the longest wait the ESP asked for (Retry-After), 0 when none


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _senders() -> ThreadPoolExecutor:
    """This process's sender threads (EMAIL_CONNECTIONS of them), started on first use."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=max(1, int(settings.EMAIL_CONNECTIONS)), thread_name_prefix="email-send"
            )
        return _executor


def _claim(campaign_id: int, batch: int, limit: int) -> list[int]:
    """Up to `limit` queued messages of the batch, moved to SENDING (an attempt each); a soft-bounced
    one only once its retry_at has come."""
    with transaction.atomic():
        ids = list(
            EmailMessage.objects.select_for_update(skip_locked=True)
            .filter(campaign_id=campaign_id, batch=batch, status=Status.QUEUED)
            .filter(Q(retry_at__isnull=True) | Q(retry_at__lte=timezone.now()))
            .order_by("id")
            .values_list("id", flat=True)[:limit]
        )
        if ids:
            EmailMessage.objects.filter(id__in=ids).update(
                status=Status.SENDING, attempts=F("attempts") + 1, sending_at=timezone.now()
            )
            lift.held_out_stamp(model=EmailMessage, campaign_id=campaign_id, batch=batch)
    return ids


def _claim_size(per_second: float) -> int:
    """Messages per claim: CLAIM_SIZE, fewer when the rate is slow, so a claim spans a few seconds."""
    size = int(settings.EMAIL_CLAIM_SIZE)
    return max(1, min(size, int(per_second * 5))) if per_second > 0 else size


def email_send_batch(*, campaign_id: int, batch: int) -> dict[str, int]:
    """Send every still-queued message of one batch. Returns counts by outcome.

    Raises Defer (no attempt spent) while the campaign or the organization's email is paused, when
    soft bounces wait for their retry, and to yield the worker after JOB_BUDGET seconds.
    """
    campaign = Campaign.objects.select_related("organization", "audience_store").get(pk=campaign_id)
    org: Organization = campaign.organization
    if not lifecycle.batch_may_send(campaign=campaign, batch=batch):
        return {}
    email_settings = EmailSettings.objects.filter(organization_id=org.pk).first()  # read fresh
    if email_settings is None:
        organizations_pause(organization_ids=[org.pk], channel="email", reason="no email settings")
        raise Defer(PAUSED_DELAY * 2, "organization has no email settings")

    compiled = compiled_email(campaign)
    server = email_transport(email_settings)
    per_second = email_settings.messages_per_minute / 60
    store_name = campaign.audience_store.name if campaign.audience_store else org.name
    counts: Counter[str] = Counter()
    started = time.monotonic()
    while True:
        if counts:  # a pause, a cancel or a paused organization takes effect between claims
            campaign.refresh_from_db(fields=["status"])
            org.refresh_from_db(fields=["email_paused_at", "email_paused_reason"])
            if not lifecycle.batch_may_send(campaign=campaign, batch=batch):
                return dict(counts)
        size = _claim_size(per_second)
        ids = _claim(campaign_id, batch, size)
        if not ids:
            break
        chunk = _send_chunk(campaign, org, email_settings, server, compiled, store_name, ids, per_second)
        chunk_apply(campaign, chunk, counts)
        if chunk.sender_failure:
            organizations_pause(organization_ids=[org.pk], channel="email", reason=chunk.sender_failure)
            raise Defer(PAUSED_DELAY * 2, f"email sending paused: {chunk.sender_failure}")
        if chunk.transient:  # no sooner than the ESP asked (Retry-After)
            wait = max(float(settings.EMAIL_RETRY_BACKOFF), chunk.retry_after)
            raise Defer(wait, f"email provider unavailable: {chunk.transient}")
        if time.monotonic() - started > JOB_BUDGET:
            raise Defer(0, "yielding the worker; the batch continues")
        if len(ids) == size:  # another tenant's work waiting on the queue runs before the rest
            jobs.yield_turn(f"email batch {campaign_id}/{batch}: another tenant's work waits")
    next_retry = EmailMessage.objects.filter(
        campaign_id=campaign_id, batch=batch, status=Status.QUEUED, retry_at__isnull=False
    ).aggregate(at=Min("retry_at"))["at"]
    if next_retry is not None:
        raise Defer(max((next_retry - timezone.now()).total_seconds(), 0.0), "soft bounces wait for a retry")
    lifecycle.campaign_complete_if_done(campaign_id=campaign_id, channel=Channel.EMAIL)
    return dict(counts)


def _send_chunk(
    campaign: Campaign,
    org: Organization,
    email_settings: EmailSettings,
    server: SmtpServer | esp.EspAccount,
    compiled: email_render.CompiledEmail,
    store_name: str,
    ids: list[int],
    per_second: float,
) -> ChunkPlan:
    """The claimed messages `ids` sent, their outcomes classified into the plan `chunk_apply` writes:
    eligibility (skips decided before any send), send (no transaction open), classify."""
    ready, skipped = chunk_eligible(campaign=campaign, ids=ids)
    if not ready:
        return ChunkPlan(skipped=skipped)
    outcomes = chunk_send(
        ready,
        org=org,
        email_settings=email_settings,
        server=server,
        compiled=compiled,
        store_name=store_name,
        per_second=per_second,
    )
    plan = chunk_classify(ready, outcomes, now=timezone.now())
    plan.skipped.extend(skipped)
    return plan


def chunk_eligible(*, campaign: Campaign, ids: list[int]) -> tuple[list[EmailMessage], list[EmailMessage]]:
    """The claimed messages split into those to send and those to skip (with their error_reason):
    opted out or without consent, suppressed, over a contact cap (checked again now, at send time)
    or with an invalid address. A message whose customer is gone is skipped on the spot."""
    messages = list(EmailMessage.objects.filter(id__in=ids).select_related("customer").order_by("id"))
    lifecycle.skip_without_customer(model=EmailMessage, campaign_id=campaign.pk, ids=ids, found=messages)
    suppressed = suppression.suppressed_addresses(
        organization_id=campaign.organization_id, addresses=[m.customer.email for m in messages]
    )
    capped = caps.skip_reasons(
        campaign=campaign, customer_ids=[m.customer_id for m in messages], now=timezone.now()
    )
    ready: list[EmailMessage] = []
    skipped: list[EmailMessage] = []
    for m in messages:
        m.email = m.customer.email.strip()
        reason = _skip_reason(m, suppressed=suppressed, capped=capped)
        if reason:
            m.error_reason = reason
            skipped.append(m)
        else:
            ready.append(m)
    return ready, skipped


def _skip_reason(m: EmailMessage, *, suppressed: set[str], capped: dict[int, str]) -> str:
    if not m.customer.marketing_consent:
        return caps.NO_CONSENT
    if not m.customer.can_receive_email:
        return "customer opted out or has no address"
    if m.email.lower() in suppressed:
        return suppression.SUPPRESSED
    if m.customer_id in capped:
        return capped[m.customer_id]
    try:
        validate_email(m.email)
    except ValidationError:
        return f"invalid address {m.email!r}"
    return ""


def chunk_send(
    ready: list[EmailMessage],
    *,
    org: Organization,
    email_settings: EmailSettings,
    server: SmtpServer | esp.EspAccount,
    compiled: email_render.CompiledEmail,
    store_name: str,
    per_second: float,
) -> list[Delivery | None]:
    """Hand `ready` to the server, up to EMAIL_CONNECTIONS at once, each on its own pooled connection
    (an SMTP session carries one message at a time and waits a round trip per command), at the
    organization's rate. One outcome per message, None for one not handed over: the server refused
    the account or the ESP cannot take messages now, and no more are sent. No database here."""
    stop = threading.Event()

    def send(m: EmailMessage) -> Delivery | None:
        """In a sender thread: render and build the message, check a connection out (opening and
        logging in when needed), then book the next slot of the organization's schedule, wait for
        it and hand the message over. The slot is booked only when the message can go the moment
        it comes, so connecting never eats into the schedule (a late first message would let the
        next ones bunch up behind it) and a slow sender never leaves slots behind that another
        would catch up on in a burst."""
        if stop.is_set():
            return None
        unsubscribe_url = links.link_url("u", m)
        rendered = email_render.render_email(
            compiled,
            variables=variables_for(m.customer, store_name=store_name, unsubscribe_url=unsubscribe_url),
            click_url=links.link_url("r", m),
            open_pixel_url=links.link_url("o", m),
        )
        try:
            message = build_message(
                email_settings=email_settings,
                to_name=m.customer.name,
                to_address=m.email,
                rendered=rendered,
                unsubscribe_url=unsubscribe_url,
            )
        except ValueError as exc:  # a header the email package refuses (a line break saved before validation)
            return Delivery(unsendable=f"the message cannot be built: {exc}"[:2000])

        def on_time() -> bool:
            # The organization's rate, in Redis: shared by every worker and process.
            slot = ratelimit.reserve(pacing.email_key(org.pk), 1, per_second)
            if slot.start > 0:
                stop.wait(slot.start)
            return not stop.is_set()

        outcome = deliver(server, lambda: message, ready=on_time)
        if outcome is not None and _stops_sending(outcome):
            stop.set()
        return outcome

    return list(_senders().map(send, ready))


def _stops_sending(outcome: Delivery) -> bool:
    return bool(outcome.transient) or (outcome.failure is not None and outcome.failure.kind is Failure.SENDER)


def chunk_classify(ready: list[EmailMessage], outcomes: list[Delivery | None], *, now: datetime) -> ChunkPlan:
    """The plan for the messages handed to `chunk_send` and its outcomes, one per message. Pure: it
    sets the fields each message will be written with and groups them; nothing is saved."""
    plan = ChunkPlan()
    for m, outcome in zip(ready, outcomes, strict=True):
        if outcome is None:
            plan.release.append(m.pk)
        elif outcome.unsendable:  # never handed over, and never will be: failed with the reason
            m.error_reason, m.failed_at = outcome.unsendable, now
            plan.failed.append(m)
        else:
            _classify_outcome(plan, m, outcome, now=now)
    return plan


def _classify_outcome(plan: ChunkPlan, m: EmailMessage, outcome: Delivery, *, now: datetime) -> None:
    """One hand-over, as every sender decides it (messaging.decisions.email), into the plan: an
    unknown outcome failed (never resent), the ESP's or our account's refusal released (the
    organization paused for the latter), a policy block kept apart (the address kept), a soft
    bounce with attempts left retried, else a bounce (a hard one suppresses the address)."""
    decision = decisions.email(outcome, attempts=m.attempts, max_attempts=ATTEMPTS)
    if decision.verdict is Verdict.SENT:
        m.status, m.smtp_reply, m.sent_at = Status.SENT, outcome.reply[:2000], now
        m.esp_message_id = outcome.message_id or None
        plan.sent.append(m)
    elif decision.verdict is Verdict.UNKNOWN:
        m.error_reason, m.failed_at = OUTCOME_UNKNOWN, now
        plan.failed.append(m)
    elif decision.verdict is Verdict.RELEASE:
        if outcome.transient:
            plan.transient = outcome.transient
            plan.retry_after = max(plan.retry_after, outcome.retry_after or 0.0)
        plan.sender_failure = plan.sender_failure or decision.pause_organization
        plan.release.append(m.pk)
    elif decision.verdict is Verdict.RETRY:
        m.bounce_message = decision.reason
        plan.retry.append(m)
    elif decision.blocked:
        m.bounce_message, m.failed_at = decision.reason, now
        plan.blocked.append(m)
    else:
        m.bounce_type = BounceType.HARD if decision.bounce == "hard" else BounceType.SOFT
        m.bounce_message, m.failed_at = decision.reason, now
        plan.bounced.append(m)
        if m.bounce_type == BounceType.HARD:
            plan.suppress.append((m.email.lower(), m.bounce_message))


def chunk_apply(campaign: Campaign, chunk: ChunkPlan, counts: Counter[str]) -> None:
    """Write the plan in one transaction, a few bulk statements (only over rows still SENDING), the
    campaign's metrics with F(); then apply ESP events that came before the commit, and count."""
    guard = {"status": Status.SENDING}
    for m in chunk.failed:
        m.status = Status.FAILED
    for m in chunk.bounced:
        m.status = Status.BOUNCED
    for m in chunk.blocked:
        m.status = Status.BLOCKED
    for m in chunk.skipped:
        m.status = Status.SKIPPED
    with transaction.atomic():
        bulk.update_rows(
            EmailMessage,
            chunk.sent,
            ["status", "email", "smtp_reply", "sent_at", "esp_message_id"],
            only_if=guard,
        )
        bulk.update_rows(
            EmailMessage,
            chunk.bounced,
            ["status", "email", "bounce_type", "bounce_message", "failed_at"],
            only_if=guard,
        )
        bulk.update_rows(
            EmailMessage, chunk.blocked, ["status", "email", "bounce_message", "failed_at"], only_if=guard
        )
        bulk.update_rows(
            EmailMessage, chunk.failed, ["status", "email", "error_reason", "failed_at"], only_if=guard
        )
        bulk.update_rows(EmailMessage, chunk.skipped, ["status", "email", "error_reason"], only_if=guard)
        for m in chunk.retry:  # exponential from EMAIL_RETRY_BACKOFF: 60 s, 120 s, …
            m.status = Status.QUEUED
            backoff = float(settings.EMAIL_RETRY_BACKOFF) * 2 ** (max(m.attempts, 1) - 1)
            m.retry_at = timezone.now() + timedelta(seconds=backoff)
        bulk.update_rows(
            EmailMessage, chunk.retry, ["status", "email", "bounce_message", "retry_at"], only_if=guard
        )
        if chunk.release:
            EmailMessage.objects.filter(id__in=chunk.release, status=Status.SENDING).update(
                status=Status.QUEUED, sending_at=None, attempts=F("attempts") - 1
            )
        CampaignMetric.objects.filter(campaign_id=campaign.pk).update(
            sent=F("sent") + len(chunk.sent),
            delivered=F("delivered") + len(chunk.sent),
            bounced=F("bounced") + len(chunk.bounced),
            blocked=F("blocked") + len(chunk.blocked),
            failed=F("failed") + len(chunk.failed),
            skipped=F("skipped") + len(chunk.skipped),
        )
        if chunk.suppress:
            suppression.addresses_suppress(organization_id=campaign.organization_id, entries=chunk.suppress)
    counts.update(
        sent=len(chunk.sent),
        bounced=len(chunk.bounced),
        blocked=len(chunk.blocked),
        failed=len(chunk.failed),
        skipped=len(chunk.skipped),
        retry=len(chunk.retry),
        released=len(chunk.release),
    )
