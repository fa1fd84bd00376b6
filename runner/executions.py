"""A run of a handler: starting it, its RunJob (produce the items, store them in chunks), the
fan-out of its items onto the priority queues (paced by the tenant's limit through a feeder job) and
the fan-in that completes it once."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from importlib import import_module
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from crm import bulk, jobs, queues
from integrations.errors import IntegrationError
from integrations.runner import client
from integrations.runner.contract import RunIn
from runner import cache, conf
from runner.models import (
    Execution,
    ExecutionItem,
    Handler,
)

logger = logging.getLogger(__name__)

CHUNK = 1000
ITEM_FUNC = "runner.tasks.items_process"
# Single items of an in-process handler travel in groups of this many per ItemJob.
ITEM_GROUP = 10
# A run larger than a minute of its tenant's limit is fanned out in this many slices per minute.
PACE_SLICES = 10
RUN_FUNC = "runner.tasks.execution_run"
FEED_FUNC = "runner.tasks.execution_feed"

_TABLE = Execution._meta.db_table


# --- starting executions -----------------------------------------------------------------------
def handler_get(*, integration_key: str, handler_key: str) -> Handler:
    return Handler.objects.select_related("integration").get(
        integration__integration_key=integration_key, handler_key=handler_key
    )


def execution_start(*, handler: Handler, organization_id: int, trigger: str) -> Execution:
    """Record a run (pending) and enqueue its RunJob on `runs` after commit."""
    execution = Execution.objects.create(
        organization_id=organization_id,
        integration_id=handler.integration_id,
        handler=handler,
        direction=handler.direction,
        trigger=trigger,
    )
    jobs.enqueue(
        RUN_FUNC,
        queue=queues.RUNS,
        kwargs={"execution_id": execution.pk},
        job_id=f"runner-run-{execution.pk}",
        unique=True,
        organization_id=organization_id,
    )
    return execution


def item_queue(trigger: str) -> str:
    return queues.items_queue(queues.JOB_PRIORITY[trigger])


def _groups(ids: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(ids), max(size, 1)):
        yield ids[start : start + size]


def _group_size(handler: Handler) -> int:
    """Items per ItemJob: a batch handler's batch; a group of single calls for an in-process handler
    (the RQ job, the admission and the claim are paid once per group); one for a single-item HTTP
    handler (each call may take up to the client timeout)."""
    if handler.batch_size > 1:
        return handler.batch_size
    return ITEM_GROUP if handler.kind == Handler.Kind.PYTHON else 1


def item_specs(execution: Execution, handler: Handler, item_ids: list[int]) -> Iterator[jobs.JobSpec]:
    queue = item_queue(execution.trigger)
    for group in _groups(item_ids, _group_size(handler)):
        yield jobs.JobSpec(
            func=ITEM_FUNC,
            queue=queue,
            kwargs={
                "organization_id": execution.organization_id,
                "integration_key": handler.integration.integration_key,
                "handler_key": handler.handler_key,
                "direction": execution.direction,
                "execution_id": execution.pk,
                "item_ids": group,
            },
            job_id=f"runner-item-{group[0]}",
            organization_id=execution.organization_id,  # served in the tenant's turn
        )


def fan_out(execution: Execution, handler: Handler, item_ids: list[int], *, offset: int = 0) -> int:
    """Enqueue the item jobs (after commit, pipelined) on the trigger's priority queue.

    Paced by the tenant's limit: a run larger than a minute of its tenant's limit is fed to the
    queue a slice at a time (a tenth of a minute's worth now, then the next every 6 s, the limit's
    own rate) by its feeder job (`execution_feed`), so a tenant's 100,000 items never stand in the
    queue ahead of every other tenant's items, and storing them costs no Redis work beyond the
    first slice. The limit itself is still enforced by the admission of each job. `offset`: items of
    the run stored before these (a run produced in chunks). Runs inside `transaction.atomic`."""
    if execution.fed_through is None:
        # A limit is at least 1: a run of one item (a webhook's) needs no read of it.
        limit = 1 if offset + len(item_ids) <= 1 else _tenant_limit(handler, execution.organization_id)
        if offset + len(item_ids) <= limit:
            return jobs.enqueue_specs(item_specs(execution, handler, item_ids))
        now_ids = item_ids[: max(_pace_slice(limit) - offset, 0)]
        # Items of this run stored before these all have jobs: the feed starts after them.
        execution.fed_through = now_ids[-1] if now_ids else item_ids[0] - 1
        Execution.objects.filter(pk=execution.pk).update(fed_through=execution.fed_through)
        _feeder_enqueue(execution, delay=60 / PACE_SLICES)
        return jobs.enqueue_specs(item_specs(execution, handler, now_ids))
    return 0  # the feeder takes them


def _tenant_limit(handler: Handler, organization_id: int) -> int:
    return int(
        cache.load(handler.integration.integration_key, handler.handler_key, organization_id)[2][
            "rate_limit_per_minute"
        ]
    )


def _pace_slice(limit: int) -> int:
    return max(limit // PACE_SLICES, 1)


def _feeder_enqueue(execution: Execution, *, delay: float) -> None:
    jobs.enqueue(
        FEED_FUNC,
        queue=item_queue(execution.trigger),
        kwargs={"execution_id": execution.pk},
        job_id=f"runner-feed-{execution.pk}",
        at=timezone.now() + timedelta(seconds=delay),
        unique=True,
        organization_id=execution.organization_id,
    )


def execution_feed(*, execution_id: int) -> str:
    """The feeder of a paced run: top its items in the queue up to one slice, then wait 6 s.

    Backpressure, not a timetable: of the run's items already fed, those still pending or running
    count against the slice, so a paused handler, an open circuit, a slow handler or the tenant's
    limit stop the feeding instead of piling jobs up, and a late feeder never turns the backlog
    into a burst. Raises Defer (no attempt spent) while items remain; the cursor is the execution's
    `fed_through`, moved in the same transaction that enqueues the slice (on commit)."""
    execution = Execution.objects.select_related("handler__integration").filter(pk=execution_id).first()
    if execution is None or execution.status != Execution.Status.RUNNING or execution.fed_through is None:
        return "nothing to feed"
    handler = execution.handler
    integration, config, tenant = cache.load(
        handler.integration.integration_key, handler.handler_key, execution.organization_id
    )
    if integration is None or config is None:
        return "integration or handler deleted"
    every = 60 / PACE_SLICES
    if not integration["enabled"] or config["paused"]:
        raise jobs.Defer(max(every, conf.get("RUNNER_PAUSE_DEFER")), "handler paused")
    size = _pace_slice(int(tenant["rate_limit_per_minute"]))
    unfinished = [ExecutionItem.Status.PENDING, ExecutionItem.Status.RUNNING]
    with transaction.atomic():
        fed_through = (
            Execution.objects.select_for_update().values_list("fed_through", flat=True).get(pk=execution_id)
        )
        waiting = ExecutionItem.objects.filter(
            execution_id=execution_id, status__in=unfinished, id__lte=fed_through
        )[:size].count()
        ids = list(
            ExecutionItem.objects.filter(
                execution_id=execution_id, status=ExecutionItem.Status.PENDING, id__gt=fed_through
            )
            .order_by("id")
            .values_list("id", flat=True)[: size - waiting]
        )
        if ids:
            Execution.objects.filter(pk=execution_id).update(fed_through=ids[-1])
            jobs.enqueue_specs(item_specs(execution, handler, ids))
    if len(ids) < size - waiting and execution.fanned_out_at is not None:
        return "fed"  # every item stored has a job (a run still producing keeps its feeder)
    raise jobs.Defer(every, "next slice")


# --- the RunJob ------------------------------------------------------------------------------

_imports: dict[str, Any] = {}


def imported(path: str) -> Any:
    obj = _imports.get(path)
    if obj is None:
        try:
            obj = import_module(path)  # a module with process() / produce()
        except ImportError:
            obj = import_string(path)  # an object (class, instance, function) inside one
        _imports[path] = obj
    return obj


def _produce(execution: Execution, handler: Handler) -> Iterator[dict[str, Any]]:
    run = RunIn(
        execution_id=execution.pk,
        organization_id=execution.organization_id,
        integration_key=handler.integration.integration_key,
        handler_key=handler.handler_key,
        direction=execution.direction,
        trigger=execution.trigger,
    )
    if handler.kind == Handler.Kind.PYTHON:
        produce = getattr(imported(handler.callable_path), "produce", None)
        if produce is not None:
            yield from produce(run)
        return
    cursor: Any = None
    while True:
        page = client.produce(
            handler.endpoint_url,
            {**run.__dict__, "cursor": cursor},
            auth_header=handler.auth_header,
            auth_value=handler.auth_value(),
        )
        yield from page.items
        if not page.next_cursor or not page.items:
            return
        cursor = page.next_cursor


def execution_run(*, execution_id: int, last_attempt: bool = True) -> str:
    """Produce the items of a run and fan them out; safe to run again (resumes after the stored items)."""
    now = timezone.now()
    Execution.objects.filter(pk=execution_id, status=Execution.Status.PENDING).update(
        status=Execution.Status.RUNNING, started_at=now
    )
    execution = Execution.objects.select_related("handler__integration").get(pk=execution_id)
    if execution.status != Execution.Status.RUNNING or execution.fanned_out_at is not None:
        return execution.status
    handler = execution.handler
    skip = execution.items_total  # a retried run resumes after what it already stored
    chunk: list[dict[str, Any]] = []
    try:
        for n, produced in enumerate(_produce(execution, handler)):
            if n < skip:
                continue
            chunk.append(produced)
            if len(chunk) >= CHUNK:
                _store_chunk(execution, handler, chunk)
                chunk = []
        if chunk:
            _store_chunk(execution, handler, chunk)
    except Exception as exc:
        retryable = not isinstance(exc, IntegrationError) or exc.retryable
        if retryable and not last_attempt:
            raise
        Execution.objects.filter(pk=execution_id).update(error=f"produce failed: {exc}"[:10_000])
        logger.warning("runner execution %s: produce failed for good: %s", execution_id, exc)
    with transaction.atomic():
        if Execution.objects.filter(pk=execution_id, fanned_out_at__isnull=True).update(fanned_out_at=now):
            settle(execution_id, released=1)
    bulk.analyze_if_grown(ExecutionItem, execution.items_total - skip)
    return "fanned-out"


def _store_chunk(execution: Execution, handler: Handler, produced: list[dict[str, Any]]) -> None:
    with transaction.atomic():
        items = ExecutionItem.objects.bulk_create(
            [
                ExecutionItem(
                    execution_id=execution.pk,
                    external_id=str(p.get("external_id") or "")[:200],
                    payload=p.get("payload"),
                )
                for p in produced
            ]
        )
        counters(execution.pk, total=len(items), remaining=len(items))
        fan_out(execution, handler, [i.pk for i in items], offset=execution.items_total)
        execution.items_total += len(items)


# --- the fan-in ------------------------------------------------------------------------------


def counters(
    execution_id: int,
    *,
    total: int = 0,
    remaining: int = 0,
    succeeded: int = 0,
    failed: int = 0,
    cancelled: int = 0,
) -> int | None:
    """Apply counter deltas in one UPDATE … RETURNING; returns items_remaining afterwards."""
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {_TABLE} SET items_total = items_total + %s, items_remaining = items_remaining + %s, "  # noqa: S608
            "items_succeeded = items_succeeded + %s, items_failed = items_failed + %s, "
            "items_cancelled = items_cancelled + %s WHERE id = %s RETURNING items_remaining",
            [total, remaining, succeeded, failed, cancelled, execution_id],
        )
        row = cur.fetchone()
    return row[0] if row else None


def settle(
    execution_id: int, *, succeeded: int = 0, failed: int = 0, cancelled: int = 0, released: int = 0
) -> bool:
    """Count finished items; the update that brings `remaining` to 0 completes the run (once)."""
    done = succeeded + failed + cancelled + released
    remaining = counters(
        execution_id, remaining=-done, succeeded=succeeded, failed=failed, cancelled=cancelled
    )
    if remaining != 0:
        return False
    now = timezone.now()
    execution = (
        Execution.objects.filter(pk=execution_id).values("error", "items_total", "items_failed").first()
    )
    failed_all = bool(execution and execution["error"] and execution["items_total"] == 0)
    won = Execution.objects.filter(pk=execution_id, status=Execution.Status.RUNNING).update(
        status=Execution.Status.FAILED if failed_all else Execution.Status.COMPLETED, finished_at=now
    )
    if won:
        jobs.get_connection().incr(f"runner:completions:{execution_id}")
        logger.info("runner execution %s completed", execution_id)
    return bool(won)
