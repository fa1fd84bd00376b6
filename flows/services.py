"""Writes of the flows app: definitions in and out, enrollments in (set-based, race-free) and out."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from crm import jobs, queues
from crm.models import Customer, Organization
from flows import schema
from flows.models import Enrollment, Flow

ADVANCE_FUNC = "flows.tasks.enrollments_advance"
# Enrollments per job: a page of sales or a tick's due steps of one organization run as one job,
# one transaction and one send batch per step campaign (flows.engine).
ADVANCE_BATCH = 100


class FlowError(ValueError):
    """An operator action that does not apply (unknown flow or organization)."""


def flow_get(*, key: str, organization_slug: str) -> Flow:
    flow = (
        Flow.objects.filter(key=key, organization__slug=organization_slug)
        .select_related("organization")
        .first()
    )
    if flow is None:
        raise FlowError(f"no flow {key!r} in organization {organization_slug!r}")
    return flow


def flow_import(*, data: Any, organization_slug: str) -> tuple[Flow, bool]:
    """Create or update the flow named by `data["key"]` (validated strictly: FlowSchemaError).
    Returns (flow, created). Changed steps bump its version: new sends use new step campaigns."""
    clean = schema.flow_parse(data)
    org = Organization.objects.filter(slug=organization_slug).first()
    if org is None:
        raise FlowError(f"no organization {organization_slug!r}")
    with transaction.atomic():
        flow = Flow.objects.select_for_update().filter(organization=org, key=clean["key"]).first()
        created = flow is None
        if flow is None:
            flow = Flow(organization=org, key=clean["key"])
        elif flow.steps != clean["steps"]:
            flow.version += 1
        for name in ("name", "trigger", "reentry", "exit_on", "steps", "transactional"):
            setattr(flow, name, clean[name])
        flow.save()
    return flow, created


def flow_export(*, flow: Flow) -> dict[str, Any]:
    """The flow as importable JSON (round-trips through flow_import)."""
    return {
        "key": flow.key,
        "name": flow.name,
        "trigger": flow.trigger,
        "reentry": flow.reentry,
        "exit_on": flow.exit_on,
        "steps": flow.steps,
        "transactional": flow.transactional,
    }


def flow_set_paused(*, flow: Flow, paused: bool) -> None:
    """Pause (no step runs, nobody enters) or resume; on resume the due steps run at once."""
    Flow.objects.filter(pk=flow.pk).update(paused=paused)
    if not paused:
        due = Enrollment.objects.filter(
            flow_id=flow.pk, status=Enrollment.Status.ACTIVE, due_at__lte=timezone.now()
        ).values_list("pk", flat=True)
        advance_enqueue(organization_id=flow.organization_id, enrollment_ids=list(due.iterator()), step="r")


def advance_job_id(enrollment_id: int, step: int | str) -> str:
    """The job of a batch whose first (lowest) enrollment is `enrollment_id`, at its step `step`."""
    return jobs.make_job_id("flows", enrollment_id, step)


def advance_spec(*, enrollment_ids: Sequence[int], step: int | str, organization_id: int) -> jobs.JobSpec:
    """One job running these enrollments' due steps (its id: the lowest one's, at `step`)."""
    ids = sorted(enrollment_ids)
    return jobs.JobSpec(
        func=ADVANCE_FUNC,
        queue=queues.FLOWS,
        kwargs={"enrollment_ids": ids},
        job_id=advance_job_id(ids[0], step),
        organization_id=organization_id,
    )


def advance_enqueue(*, organization_id: int, enrollment_ids: Sequence[int], step: int | str = 0) -> None:
    """Run these enrollments' due steps (after the transaction commits), one job per ADVANCE_BATCH."""
    ids = sorted(enrollment_ids)
    jobs.enqueue_specs(
        advance_spec(enrollment_ids=ids[i : i + ADVANCE_BATCH], step=step, organization_id=organization_id)
        for i in range(0, len(ids), ADVANCE_BATCH)
    )


# Who may enter again, as a condition on the customer's last enrollment in the flow (`last`).
def _reentry_sql(reentry: Any) -> tuple[str, list[Any]]:
    if reentry == "always":
        return "true", []
    if isinstance(reentry, dict):
        return "(last.entered_at IS NULL OR last.entered_at < %s)", [
            timezone.now() - timedelta(days=int(reentry["once_per_days"]))
        ]
    return "last.round IS NULL", []


def enroll(
    *, flow: Flow, customer_ids: Sequence[int], entry_keys: Sequence[str], now: datetime | None = None
) -> list[int]:
    """Enter these customers of the flow's organization (one entry key each: the fact that made
    them enter) and enqueue their first steps; returns the new enrollments' ids.

    One statement whatever the count. Race-free: each entry takes the customer's next round, and
    (flow, customer, round) and (flow, customer, entry key) are unique, so two concurrent entries
    of the same customer, or the same fact seen twice, make one enrollment (ON CONFLICT DO
    NOTHING), and the reentry rule is read in the same statement."""
    if flow.paused or not customer_ids:
        return []
    now = now or timezone.now()
    reentry, reentry_params = _reentry_sql(flow.reentry)
    table, customers = Enrollment._meta.db_table, Customer._meta.db_table
    sql = (
        f"INSERT INTO {table} (flow_id, organization_id, customer_id, round, entry_key, status, "  # noqa: S608
        "step_index, due_at, branch, holdout, entered_at, exit_reason) "
        "SELECT %s, %s, given.id, coalesce(last.round, 0) + 1, given.entry_key, 'active', 0, %s, '', "
        "false, %s, '' FROM unnest(%s::bigint[], %s::text[]) AS given(id, entry_key) "
        f"JOIN {customers} c ON c.id = given.id AND c.organization_id = %s "
        f"LEFT JOIN LATERAL (SELECT e.round, e.entered_at FROM {table} e WHERE e.flow_id = %s "
        "AND e.customer_id = given.id ORDER BY e.round DESC LIMIT 1) AS last ON true "
        f"WHERE {reentry} ON CONFLICT DO NOTHING RETURNING id"
    )
    params: list[Any] = [flow.pk, flow.organization_id, now, now, list(customer_ids), list(entry_keys)]
    params += [flow.organization_id, flow.pk, *reentry_params]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = [row[0] for row in cursor.fetchall()]
        advance_enqueue(organization_id=flow.organization_id, enrollment_ids=ids)
    return ids


def enrollments_exit(*, organization_id: int, customer_ids: Sequence[int], event: str) -> int:
    """End the customers' active enrollments in flows whose exit_on names `event`; returns how many."""
    if not customer_ids:
        return 0
    flows = Flow.objects.filter(organization_id=organization_id, exit_on__contains=[event])
    return Enrollment.objects.filter(
        customer_id__in=list(customer_ids), status=Enrollment.Status.ACTIVE, flow__in=flows
    ).update(
        status=Enrollment.Status.EXITED,
        exit_reason=f"exit_on {event}",
        due_at=None,
        finished_at=timezone.now(),
    )


def enrollments_replied(*, customer_ids: Sequence[int], at: datetime) -> int:
    """Mark the customers' active enrollments as replied (the `replied` condition)."""
    if not customer_ids:
        return 0
    return Enrollment.objects.filter(
        customer_id__in=list(customer_ids), status=Enrollment.Status.ACTIVE, replied_at__isnull=True
    ).update(replied_at=at)


def flow_test_send(*, flow: Flow, customer: Customer) -> list[int]:
    """Enter one customer now, whatever the trigger and reentry rule (the admin's test-send); the
    guards still apply at each send. Returns the enrollment's id."""
    key = f"test:{timezone.now().isoformat()}"
    always = Flow(pk=flow.pk, organization_id=flow.organization_id, reentry="always", paused=False)
    return enroll(flow=always, customer_ids=[customer.pk], entry_keys=[key])
