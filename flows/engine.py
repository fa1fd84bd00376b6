"""Running enrollments' due steps, each exactly once.

`enrollments_advance` (one job per batch of enrollments: a page of sales, a tick's due steps)
locks the enrollments' rows in one transaction (a second job for one of them waits, then finds
nothing due), runs each one's step at `step_index` and records it with the enrollment's move to
the next step, written set-based for the whole batch (the steps, the messages, the campaigns'
queued counts, the moves: a few statements per batch, not per enrollment): the EnrollmentStep
row is unique per (enrollment, step), so a retried, recovered or duplicated job never runs a
step twice. A send step writes its message into the step's campaign (one message per campaign
and customer: the campaigns' own exactly-once) and, after the commit, the job sends the batch
through the campaigns' send batch, which claims each message before calling the provider and
applies consent, opt-outs, the contact caps, pacing and the error policy (flows.sending). A
runner step calls the runner after its commit (a durable transaction of its own), under an
event id per step, so a re-run is recognised as a redelivery.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from campaigns import lift
from campaigns.models import (
    Campaign,
    CampaignMetric,
    Channel,
    CustomerSegment,
    EmailMessage,
    WhatsappMessage,
)
from crm.models import Sale
from flows import guards, sending
from flows.models import Enrollment, EnrollmentStep
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
Outcome = EnrollmentStep.Outcome


@dataclass
class _Ran:
    stop: bool = False  # the enrollment waits (or ended): the job is done
    after: dict[str, Any] | None = None  # a runner call to make after the commit
    # (channel, campaign, batch, organization) to send after the commit
    send: tuple[Channel, int, int, int] | None = None


@dataclass
class _Writes:
    """A batch's rows, written in a few set-based statements when its steps have run (in the
    transaction holding the enrollments' locks): the steps, the messages, the campaigns' queued
    counts and the enrollments' moves."""

    steps: list[EnrollmentStep] = field(default_factory=list)
    messages: dict[Any, list[Any]] = field(default_factory=dict)
    queued: dict[int, int] = field(default_factory=dict)
    moved: dict[int, Enrollment] = field(default_factory=dict)
    held: set[int] = field(default_factory=set)  # the batch's customers in the global holdout

    def flush(self) -> None:
        for model, rows in self.messages.items():
            model.objects.bulk_create(rows)
        for campaign_id, n in sorted(self.queued.items()):
            CampaignMetric.objects.filter(campaign_id=campaign_id).update(queued=F("queued") + n)
        EnrollmentStep.objects.bulk_create(self.steps)
        if self.moved:
            _moves_write(list(self.moved.values()))


_WRITES: ContextVar[_Writes | None] = ContextVar("flows_writes", default=None)
# An enrollment's columns a step moves, with their types: one UPDATE … FROM unnest for a batch.
MOVES = (
    ("status", "text"),
    ("step_index", "integer"),
    ("due_at", "timestamptz"),
    ("branch", "text"),
    ("holdout", "boolean"),
    ("finished_at", "timestamptz"),
    ("exit_reason", "text"),
)


def _moves_write(enrollments: list[Enrollment]) -> None:
    """The enrollments' moves in one statement (Django's bulk_update builds a CASE per row and
    column: most of a batch's CPU)."""
    names = [name for name, _ in MOVES]
    sql = (
        f"UPDATE {Enrollment._meta.db_table} e SET "  # noqa: S608 - names from MOVES
        + ", ".join(f"{n} = m.{n}" for n in names)
        + " FROM unnest(%s::bigint[], "
        + ", ".join(f"%s::{t}[]" for _, t in MOVES)
        + f") AS m(id, {', '.join(names)}) WHERE e.id = m.id"
    )
    params = [[e.pk for e in enrollments], *([getattr(e, n) for e in enrollments] for n in names)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def enrollment_advance(*, enrollment_id: int) -> str:
    """One enrollment's due steps (an older job's shape): `enrollments_advance` of it alone."""
    return enrollments_advance(enrollment_ids=[enrollment_id])[enrollment_id]


def enrollments_advance(*, enrollment_ids: Sequence[int]) -> dict[int, str]:
    """Run the enrollments' due steps until each waits or ends, and those of up to STEAL other due
    enrollments of their organizations (their own jobs then find nothing due), in one transaction
    holding their locks, written set-based; their messages share one send batch per step
    campaign, sent after the commit. Returns what each of `enrollment_ids` ended on. Safe to run
    twice, concurrently or after a crash anywhere."""
    ids = sorted(set(enrollment_ids))
    sends: dict[tuple[Channel, int, int], None] = {}
    states: dict[int, str] = {}
    token, cached = _BATCH.set(ids[0] if ids else None), sending.CAMPAIGNS.set({})
    try:
        todo, steal = ids, True
        for _ in range(MAX_STEPS_PER_RUN):
            if not todo:
                break
            try:
                afters = _advance_batch(todo, states, sends, steal=steal)
            except Exception:
                if len(todo) == 1:
                    raise
                afters = _advance_singly(todo, states, sends)
            for after in afters:
                _runner_call(**after)
            todo, steal = sorted(a["enrollment_id"] for a in afters), False
        for enrollment_id in todo:
            states[enrollment_id] = "more"  # a loop of steps: the tick comes back for the rest
    finally:
        _BATCH.reset(token)
        sending.CAMPAIGNS.reset(cached)
    for channel, campaign_id, org in sends:
        sending.send_now(channel, campaign_id, ids[0], org)
    return {i: states.get(i, "gone") for i in ids}


def _advance_singly(
    ids: list[int], states: dict[int, str], sends: dict[tuple[Channel, int, int], None]
) -> list[dict[str, Any]]:
    """A batch that failed, each enrollment in a transaction of its own (one bad row does not hold
    back the others); the first error is raised after the rest ran (the job retries it)."""
    afters: list[dict[str, Any]] = []
    error: Exception | None = None
    for enrollment_id in ids:
        try:
            afters += _advance_batch([enrollment_id], states, sends, steal=False)
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error
    return afters


def _advance_batch(
    ids: list[int], states: dict[int, str], sends: dict[tuple[Channel, int, int], None], *, steal: bool
) -> list[dict[str, Any]]:
    """One transaction: lock `ids` (waiting for a job that holds one) and, with `steal`, other due
    enrollments of their organizations (skipping locked ones), run their due steps, write them.
    Returns the runner calls to make after the commit."""
    afters: list[dict[str, Any]] = []
    batch_sends: dict[tuple[Channel, int, int], None] = {}
    with transaction.atomic():
        locked = _locked(Enrollment.objects.filter(pk__in=ids).order_by("pk"), skip_locked=False)
        if steal:
            orgs = sorted({e.organization_id for e in locked if not _state(e)})
            if orgs:
                others = Enrollment.objects.filter(
                    status=Enrollment.Status.ACTIVE, due_at__lte=timezone.now(), organization_id__in=orgs
                ).exclude(pk__in=ids)
                locked += _locked(others.order_by("due_at")[:STEAL], skip_locked=True)
        writes = _Writes(held=guards.held_out(enrollments=[e for e in locked if not _state(e)]))
        token = _WRITES.set(writes)
        try:
            for enrollment in locked:
                state = _state(enrollment)
                if not state:
                    ran = _run_due(enrollment, batch_sends)
                    if ran.after:
                        afters.append(ran.after)
                    state = "waiting" if enrollment.status == Enrollment.Status.ACTIVE else enrollment.status
                states[enrollment.pk] = state
        finally:
            _WRITES.reset(token)
        writes.flush()
    sends.update(batch_sends)
    return afters


def _locked(query: Any, *, skip_locked: bool) -> list[Enrollment]:
    return list(
        query.select_for_update(of=("self",), skip_locked=skip_locked).select_related(
            "flow", "flow__organization", "customer"
        )
    )


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


def _save(enrollment: Enrollment, fields: list[str]) -> None:
    """The enrollment's move: with the batch's writes when a batch runs, else now."""
    writes = _WRITES.get()
    if writes is not None:
        writes.moved[enrollment.pk] = enrollment
    else:
        enrollment.save(update_fields=fields)


def _finish(enrollment: Enrollment, status: str, now: datetime, reason: str = "") -> None:
    enrollment.status = status
    enrollment.due_at = None
    enrollment.finished_at = now
    enrollment.exit_reason = reason[:200]
    _save(enrollment, ["status", "due_at", "finished_at", "exit_reason"])


def _record(
    enrollment: Enrollment, step: dict, outcome: str, detail: str = "", *, at_once: bool = False, **extra: Any
) -> EnrollmentStep:
    """The step's row: with the batch's writes when a batch runs (unless its id is needed now)."""
    row = EnrollmentStep(
        enrollment=enrollment,
        flow_id=enrollment.flow_id,
        index=enrollment.step_index,
        type=step["type"],
        outcome=outcome,
        detail=detail[:300],
        **extra,
    )
    writes = _WRITES.get()
    if writes is not None and not at_once:
        writes.steps.append(row)
    else:
        row.save(force_insert=True)
    return row


def _next(enrollment: Enrollment, due_at: datetime | None) -> None:
    enrollment.step_index += 1
    enrollment.due_at = due_at
    fields = ["step_index", "due_at", "branch", "holdout"]
    if enrollment.step_index >= len(enrollment.flow.steps) and (due_at is None or due_at <= timezone.now()):
        # The last step, nothing to wait for: completed in the same statement (not one more).
        enrollment.status = Enrollment.Status.COMPLETED
        enrollment.due_at, enrollment.finished_at = None, due_at or timezone.now()
        fields += ["status", "finished_at"]
    _save(enrollment, fields)


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
        _save(enrollment, ["due_at"])
        return _Ran(stop=True)
    writes = _WRITES.get()
    held = guards.global_holdout(enrollment=enrollment, held=writes.held if writes is not None else None)
    if held:  # out of every send and of the experiments alike (a campaign's fan-out leaves them out)
        _record(enrollment, step, Outcome.HOLDOUT, held)
        _next(enrollment, now)
        return _Ran()
    channel = Channel.EMAIL if step["type"] == "send_email" else Channel.WHATSAPP
    campaign = sending.step_campaign(
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
    message = model(
        campaign_id=campaign.pk,
        organization_id=campaign.organization_id,
        customer_id=enrollment.customer_id,
        batch=_BATCH.get() or enrollment.pk,
        **fields,
    )
    if writes is not None:
        writes.messages.setdefault(model, []).append(message)
        writes.queued[campaign.pk] = writes.queued.get(campaign.pk, 0) + 1
    else:
        message.save(force_insert=True)
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
    pending = _record(
        enrollment, step, Outcome.PENDING, f"{step['integration']}/{step['handler']}", at_once=True
    )
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
