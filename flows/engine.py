"""Running an enrollment's due steps, each exactly once.

`enrollment_advance` locks the enrollment's row (a second job for it waits, then finds nothing
due), runs the step at `step_index` and records it in the same transaction as the enrollment's
move to the next step: the EnrollmentStep row is unique per (enrollment, step), so a retried,
recovered or duplicated job never runs a step twice. A send step writes its message into the
step's campaign (one message per campaign and customer: the campaigns' own exactly-once) and
enqueues the campaigns' send batch, which claims it before calling the provider and applies
consent, opt-outs, the contact caps, pacing and the error policy. A runner step calls the
runner after its commit (a durable transaction of its own), under an event id per step, so a
re-run is recognised as a redelivery.
"""

from __future__ import annotations

import logging
import random
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from campaigns import lifecycle, lift
from campaigns.email.sending import email_send_batch
from campaigns.models import (
    Campaign,
    CampaignMetric,
    Channel,
    CustomerSegment,
    EmailMessage,
    Kind,
    WhatsappMessage,
)
from campaigns.whatsapp.sending import whatsapp_send_batch
from crm import jobs, queues
from crm.models import Sale
from flows import guards
from flows.models import Enrollment, EnrollmentStep, Flow, StepCampaign
from integrations.models import WhatsappNumber
from messaging import conversations
from runner.events import events_store
from runner.executions import handler_get
from runner.models import Handler

logger = logging.getLogger(__name__)

MAX_STEPS_PER_RUN = 50
# Due enrollments of the same organization one job also runs (a burst of events: one job, and one
# send batch per step campaign, serve many).
STEAL = 100
# The send batch of the messages written by the running job: its first enrollment's id.
_BATCH: ContextVar[int | None] = ContextVar("flows_batch", default=None)
# The step campaigns the running job has looked up (a step's campaign never changes).
_CAMPAIGNS: ContextVar[dict[tuple[int, int, int, int], Campaign] | None] = ContextVar(
    "flows_campaigns", default=None
)
SEND_FUNCS = {
    Channel.WHATSAPP: "campaigns.tasks.whatsapp_send_batch",
    Channel.EMAIL: "campaigns.tasks.email_send_batch",
}
Outcome = EnrollmentStep.Outcome


@dataclass
class _Ran:
    stop: bool = False  # the enrollment waits (or ended): the job is done
    after: dict[str, Any] | None = None  # a runner call to make after the commit
    # (channel, campaign, batch, organization) to send after the commit
    send: tuple[Channel, int, int, int] | None = None


def enrollment_advance(*, enrollment_id: int) -> str:
    """Run the enrollment's due steps until it waits or ends, and those of up to STEAL other due
    enrollments of its organization (their own jobs then find nothing due); their messages share
    one send batch per step campaign, sent at the end. Returns what the enrollment ended on. Safe
    to run twice, concurrently or after a crash anywhere."""
    sends: dict[tuple[Channel, int, int], None] = {}
    token, cached = _BATCH.set(enrollment_id), _CAMPAIGNS.set({})
    try:
        state = _advance_one(enrollment_id, sends=sends, skip_locked=False)
        organization_id = next(iter(sends), (None, None, None))[2] if sends else None
        if organization_id is not None:
            for other in _due_of(organization_id, exclude=enrollment_id):
                _advance_one(other, sends=sends, skip_locked=True)
    finally:
        _BATCH.reset(token)
        _CAMPAIGNS.reset(cached)
    for channel, campaign_id, org in sends:
        send_now(channel, campaign_id, enrollment_id, org)
    return state


def _due_of(organization_id: int, *, exclude: int) -> list[int]:
    """Other due enrollments of the organization, oldest first (a range of `enrollment_due`)."""
    due = Enrollment.objects.filter(
        status=Enrollment.Status.ACTIVE, due_at__lte=timezone.now(), organization_id=organization_id
    ).exclude(pk=exclude)
    return list(due.order_by("due_at").values_list("pk", flat=True)[:STEAL])


def _advance_one(
    enrollment_id: int, *, sends: dict[tuple[Channel, int, int], None], skip_locked: bool
) -> str:
    for _ in range(MAX_STEPS_PER_RUN):
        with transaction.atomic():
            enrollment = (
                Enrollment.objects.select_for_update(of=("self",), skip_locked=skip_locked)
                .select_related("flow", "flow__organization", "customer")
                .filter(pk=enrollment_id)
                .first()
            )
            state = _state(enrollment)
            if state:
                return state
            assert enrollment is not None
            ran = _run_due(enrollment, sends)
        if ran.after:
            _runner_call(**ran.after)
            continue
        return "waiting" if enrollment.status == Enrollment.Status.ACTIVE else enrollment.status
    return "more"  # a loop of steps: the tick comes back for the rest


def _run_due(enrollment: Enrollment, sends: dict[tuple[Channel, int, int], None]) -> _Ran:
    """The steps due now, one after the other in this transaction (each recorded with the move
    to the next), until one waits, ends the enrollment or calls the runner (after the commit)."""
    ran = _Ran()
    for _ in range(MAX_STEPS_PER_RUN):
        ran = _run_step(enrollment, timezone.now())
        if ran.send:
            channel, campaign_id, _, org = ran.send
            sends[(channel, campaign_id, org)] = None
        if ran.after or ran.stop or enrollment.status != Enrollment.Status.ACTIVE:
            return ran
    return _Ran(stop=True)  # a long run of steps: the tick comes back for the rest


def _state(enrollment: Enrollment | None) -> str:
    """Why nothing runs now, or "" when the enrollment's next step is due."""
    if enrollment is None:
        return "gone"
    if enrollment.status != Enrollment.Status.ACTIVE:
        return enrollment.status
    if enrollment.flow.paused:
        return "paused"
    if enrollment.due_at is None or enrollment.due_at > timezone.now():
        return "waiting"
    return ""


def _finish(enrollment: Enrollment, status: str, now: datetime, reason: str = "") -> None:
    enrollment.status = status
    enrollment.due_at = None
    enrollment.finished_at = now
    enrollment.exit_reason = reason[:200]
    enrollment.save(update_fields=["status", "due_at", "finished_at", "exit_reason"])


def _record(
    enrollment: Enrollment, step: dict, outcome: str, detail: str = "", **extra: Any
) -> EnrollmentStep:
    return EnrollmentStep.objects.create(
        enrollment=enrollment,
        flow_id=enrollment.flow_id,
        index=enrollment.step_index,
        type=step["type"],
        outcome=outcome,
        detail=detail[:300],
        **extra,
    )


def _next(enrollment: Enrollment, due_at: datetime | None) -> None:
    enrollment.step_index += 1
    enrollment.due_at = due_at
    fields = ["step_index", "due_at", "branch", "holdout"]
    if enrollment.step_index >= len(enrollment.flow.steps) and (due_at is None or due_at <= timezone.now()):
        # The last step, nothing to wait for: completed in the same statement (not one more).
        enrollment.status = Enrollment.Status.COMPLETED
        enrollment.due_at, enrollment.finished_at = None, due_at or timezone.now()
        fields += ["status", "finished_at"]
    enrollment.save(update_fields=fields)


def _run_step(enrollment: Enrollment, now: datetime) -> _Ran:
    steps = enrollment.flow.steps
    if enrollment.step_index >= len(steps):
        _finish(enrollment, Enrollment.Status.COMPLETED, now)
        return _Ran(stop=True)
    step = steps[enrollment.step_index]
    # Only a runner step is recorded before it is done (pending until the runner has it).
    pending = (
        EnrollmentStep.objects.filter(enrollment=enrollment, index=enrollment.step_index).first()
        if step["type"] == "runner"
        else None
    )
    if pending is not None:  # a runner step whose call may not have happened: call again (deduplicated)
        return _Ran(after=_runner_args(enrollment, step, pending))
    if step.get("branch") and step["branch"] != enrollment.branch:
        _record(enrollment, step, Outcome.SKIPPED, f"branch {enrollment.branch or '-'}")
        _next(enrollment, now)
        return _Ran()
    return _STEPS[step["type"]](enrollment, step, now)


# --- wait --------------------------------------------------------------------------------------


def wait_until(*, step: dict, start: datetime, tz: ZoneInfo) -> datetime:
    """When a wait step that began at `start` ends: its duration, then its local `at` time (the
    first one at or after the duration's end)."""
    end = start + timedelta(
        days=step.get("days", 0), hours=step.get("hours", 0), minutes=step.get("minutes", 0)
    )
    if "at" not in step:
        return end
    hour, minute = (int(p) for p in step["at"].split(":"))
    local = end.astimezone(tz)
    candidate = datetime.combine(local.date(), time(hour, minute), tzinfo=tz)
    if candidate < local:
        candidate = datetime.combine(local.date() + timedelta(days=1), time(hour, minute), tzinfo=tz)
    return candidate


def _wait(enrollment: Enrollment, step: dict, now: datetime) -> _Ran:
    due = wait_until(step=step, start=now, tz=ZoneInfo(enrollment.flow.organization.timezone))
    _record(enrollment, step, Outcome.DONE, f"until {due.isoformat()}")
    _next(enrollment, due)
    return _Ran(stop=due > now)


# --- send --------------------------------------------------------------------------------------


def _send(enrollment: Enrollment, step: dict, now: datetime) -> _Ran:
    org = enrollment.flow.organization
    quiet_end = guards.quiet_until(now=now, tz=ZoneInfo(org.timezone), spec=settings.FLOWS_QUIET_HOURS)
    if quiet_end is not None:
        enrollment.due_at = quiet_end
        enrollment.save(update_fields=["due_at"])
        return _Ran(stop=True)
    held = guards.global_holdout(enrollment=enrollment)
    if held:  # out of every send and of the experiments alike (a campaign's fan-out leaves them out)
        _record(enrollment, step, Outcome.HOLDOUT, held)
        _next(enrollment, now)
        return _Ran()
    channel = Channel.EMAIL if step["type"] == "send_email" else Channel.WHATSAPP
    campaign = step_campaign(
        flow=enrollment.flow, index=enrollment.step_index, round=enrollment.round, step=step
    )
    if enrollment.holdout:
        return _hold_out(enrollment, step, now, campaign)
    if campaign is None:
        _record(enrollment, step, Outcome.SKIPPED, f"the organization has no {channel} sender")
        _next(enrollment, now)
        return _Ran()
    model: Any = EmailMessage if channel == Channel.EMAIL else WhatsappMessage
    fields: dict[str, Any] = (
        {"whatsapp_number_id": campaign.whatsapp_number_id} if model is WhatsappMessage else {}
    )
    # One message per (step campaign, customer), and the campaign is this round's and version's:
    # only this enrollment (under its lock, its step not recorded yet) can write the row, so no
    # "exists?" read first; the campaigns' unique (campaign, customer) stays the backstop. Its
    # batch is the job's: one send batch per step campaign for every enrollment the job ran.
    model.objects.create(
        campaign_id=campaign.pk,
        organization_id=campaign.organization_id,
        customer_id=enrollment.customer_id,
        batch=_BATCH.get() or enrollment.pk,
        **fields,
    )
    CampaignMetric.objects.filter(campaign_id=campaign.pk).update(queued=F("queued") + 1)
    _record(enrollment, step, Outcome.QUEUED, f"{channel} message", campaign=campaign)
    _next(enrollment, now)
    return _Ran(send=(channel, campaign.pk, _BATCH.get() or enrollment.pk, campaign.organization_id))


def _hold_out(enrollment: Enrollment, step: dict, now: datetime, campaign: Campaign | None) -> _Ran:
    """A split's holdout branch at a send step: nothing sent; the customer recorded in the step's
    campaign as held out (its control arm) with the would-be send time, now, unless the send
    pipeline would have skipped them (then in neither arm, like a skipped treatment message)."""
    reason = (
        "no sender"
        if campaign is None
        else lift.held_out_skip_reason(campaign=campaign, customer=enrollment.customer, now=now)
    )
    if not reason:
        assert campaign is not None
        lift.held_out_record(campaign=campaign, customer_id=enrollment.customer_id, at=now)
    _record(
        enrollment,
        step,
        Outcome.HOLDOUT,
        f"split holdout ({'control arm' if not reason else 'in neither arm: ' + reason})",
        campaign=campaign,
    )
    _next(enrollment, now)
    return _Ran()


def send_now(channel: Channel, campaign_id: int, batch: int, organization_id: int) -> None:
    """The step's message through the campaigns' send batch, in this job (no second hop): the
    batch claims it before calling the provider. What must wait (pacing, a pause: Defer) or
    failed here goes to the channel's send queue, where its retries and give-up apply; a crash
    before this leaves it queued for the `whatsapp-batches`/`email-batches` recoverer."""
    func = email_send_batch if channel == Channel.EMAIL else whatsapp_send_batch
    try:
        func(campaign_id=campaign_id, batch=batch)
    except Exception as exc:  # the job's edge for this send: handed to the queue that retries it
        delay = exc.seconds if isinstance(exc, jobs.Defer) else 1.0
        if not isinstance(exc, jobs.Defer):
            logger.warning("flow send of campaign %s batch %s failed (%s); queued", campaign_id, batch, exc)
        jobs.enqueue(
            SEND_FUNCS[channel],
            queue=queues.EMAIL_SEND if channel == Channel.EMAIL else queues.WHATSAPP_SEND,
            kwargs={"campaign_id": campaign_id, "batch": batch},
            job_id=lifecycle.batch_job_id(campaign_id, batch, channel),
            delay=delay,
            organization_id=organization_id,
            after_commit=False,
        )


def _campaign_fields(flow: Flow, step: dict) -> dict[str, Any] | None:
    if step["type"] == "send_email":
        return {
            "channel": Channel.EMAIL,
            "email_subject": step["subject"],
            "email_body": step["body"],
            "email_body_format": step.get("body_format", "mjml"),
        }
    number = WhatsappNumber.objects.filter(organization_id=flow.organization_id).order_by("pk").first()
    if number is None:
        return None
    return {
        "channel": Channel.WHATSAPP,
        "whatsapp_number": number,
        "template_name": step["template"],
        "template_language": step.get("language", "pt_BR"),
        "template_category": step.get("category", "utility" if flow.transactional else "marketing"),
        "template_variables": step.get("variables", []),
        "header_image_url": step.get("header_image_url", ""),
    }


def step_campaign(*, flow: Flow, index: int, round: int, step: dict) -> Campaign | None:
    """The campaign carrying this send step's messages for this round (made once, race-free:
    StepCampaign is unique); None when the organization has no WhatsApp number for it."""
    key = {"flow": flow, "version": flow.version, "index": index, "round": round}
    cache = _CAMPAIGNS.get()
    cached = cache.get((flow.pk, flow.version, index, round)) if cache is not None else None
    if cached is not None:
        return cached
    found = StepCampaign.objects.filter(**key).select_related("campaign").first()
    if found is not None:
        if cache is not None:
            cache[(flow.pk, flow.version, index, round)] = found.campaign
        return found.campaign
    fields = _campaign_fields(flow, step)
    if fields is None:
        return None
    try:
        with transaction.atomic():
            now = timezone.now()
            campaign = Campaign.objects.create(
                organization_id=flow.organization_id,
                name=f"{flow.name} · {index + 1}" + (f" · {round}" if round > 1 else ""),
                status=Campaign.Status.SENDING,
                started_at=now,
                kind=Kind.FLOW,
                caps_exempt=flow.transactional,
                control_percent=flow.control_percent,
                **fields,
            )
            CampaignMetric.objects.create(campaign=campaign)
            StepCampaign.objects.create(campaign=campaign, **key)
    except IntegrityError:
        return StepCampaign.objects.select_related("campaign").get(**key).campaign
    return campaign


# --- condition, split, handoff, runner --------------------------------------------------------------


def condition_holds(*, enrollment: Enrollment, step: dict) -> bool:
    """Is the step's `if` true for this enrollment now?"""
    what = step["if"]
    if what == "purchased_since_entry":
        return Sale.objects.filter(
            customer_id=enrollment.customer_id, sold_at__gte=enrollment.entered_at
        ).exists()
    if what == "consent":
        return bool(enrollment.customer.marketing_consent)
    if what == "replied":
        return enrollment.replied_at is not None
    latest = (
        CustomerSegment.objects.filter(organization_id=enrollment.organization_id)
        .order_by("-day")
        .values_list("day", flat=True)
        .first()
    )
    return (
        latest is not None
        and CustomerSegment.objects.filter(
            organization_id=enrollment.organization_id,
            day=latest,
            customer_id=enrollment.customer_id,
            segment=step["segment"],
        ).exists()
    )


def _condition(enrollment: Enrollment, step: dict, now: datetime) -> _Ran:
    holds = condition_holds(enrollment=enrollment, step=step)
    exits = (step["then"] == "exit") == holds
    _record(enrollment, step, Outcome.EXITED if exits else Outcome.DONE, f"{step['if']}: {holds}")
    if exits:
        _finish(enrollment, Enrollment.Status.EXITED, now, f"condition {step['if']}")
        return _Ran(stop=True)
    _next(enrollment, now)
    return _Ran()


def _split(enrollment: Enrollment, step: dict, now: datetime) -> _Ran:
    branches = step["branches"]
    branch = random.choices(branches, weights=[b["percent"] for b in branches])[0]
    enrollment.branch = branch["name"][:40]
    enrollment.holdout = bool(branch["holdout"])
    _record(
        enrollment,
        step,
        Outcome.DONE,
        f"branch {branch['name']}" + (" (holdout)" if branch["holdout"] else ""),
    )
    _next(enrollment, now)
    return _Ran()


def _handoff(enrollment: Enrollment, step: dict, now: datetime) -> _Ran:
    # Written with the step (same transaction: once); Chatwoot gets it after the commit, in order
    # with the customer's conversation, waiting while Chatwoot is down.
    note = conversations.handoff_queue(
        customer=enrollment.customer,
        flow_name=enrollment.flow.name,
        note=step.get("note", ""),
        assignee_id=step.get("assignee_id"),
        team_id=step.get("team_id"),
    )
    where = "Chatwoot" if note.chatwoot_pending else "the customer's page"
    _record(enrollment, step, Outcome.DONE, f"handed over ({where}): {step.get('note', '')}".strip())
    _next(enrollment, now)
    return _Ran()


def _runner(enrollment: Enrollment, step: dict, now: datetime) -> _Ran:
    pending = _record(enrollment, step, Outcome.PENDING, f"{step['integration']}/{step['handler']}")
    return _Ran(after=_runner_args(enrollment, step, pending))


def _runner_args(enrollment: Enrollment, step: dict, pending: EnrollmentStep) -> dict[str, Any]:
    c = enrollment.customer
    return {
        "step_id": pending.pk,
        "enrollment_id": enrollment.pk,
        "organization_id": enrollment.organization_id,
        "integration": step.get("integration", ""),
        "handler": step.get("handler", ""),
        "payload": {
            "flow": enrollment.flow.key,
            "customer": {"id": c.pk, "erp_id": c.erp_id, "name": c.name, "email": c.email, "phone": c.phone},
        },
    }


def _runner_call(
    *, step_id: int, enrollment_id: int, organization_id: int, integration: str, handler: str, payload: dict
) -> None:
    """Hand the customer to the runner's handler (its own durable transaction), then settle the step."""
    try:
        found = handler_get(integration_key=integration, handler_key=handler)
    except Handler.DoesNotExist:
        found = None
    if found is not None:
        events_store(
            handler=found,
            organization_id=organization_id,
            trigger="queue",
            events=[
                {
                    "external_id": str(payload["customer"]["id"]),
                    "payload": payload,
                    "event_id": f"flow-step-{step_id}",
                }
            ],
        )
    with transaction.atomic():
        enrollment = Enrollment.objects.select_for_update().get(pk=enrollment_id)
        done = EnrollmentStep.objects.filter(pk=step_id, outcome=Outcome.PENDING).update(
            outcome=Outcome.DONE if found else Outcome.SKIPPED,
            detail="" if found else f"no handler {integration}/{handler}",
        )
        if done:
            _next(enrollment, timezone.now())


_STEPS = {
    "wait": _wait,
    "send_whatsapp": _send,
    "send_email": _send,
    "condition": _condition,
    "split": _split,
    "handoff": _handoff,
    "runner": _runner,
}
