"""Every write of the integration runner: executions, their items, the fan-out and the fan-in."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib import import_module
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.module_loading import import_string

from crm import bulk, inbox, jobs, queues, recovery
from crm.resilience import Admission, BreakerPolicy, Gate
from integrations.errors import IntegrationError
from integrations.runner import client
from integrations.runner.contract import ItemIn, ItemOutcome, RunIn
from runner import cache, conf
from runner.models import (
    EVENT_ID_MAX,
    MAX_ATTEMPTS,
    Execution,
    ExecutionItem,
    Handler,
    IntegrationType,
    Trigger,
    WebhookEvent,
)
from runner.plan import ItemsPlan, items_classify

logger = logging.getLogger(__name__)

CHUNK = 1000
# How long a webhook event id is remembered (a provider's retries come within hours).
WEBHOOK_EVENT_KEEP = timedelta(days=7)
# An item claimed this long ago by a job that never reported back (its worker died) may be claimed again.
STALE_CLAIM = timedelta(minutes=10)
ITEM_FUNC = "runner.tasks.items_process"
# Single items of an in-process handler travel in groups of this many per ItemJob.
ITEM_GROUP = 10
# A run larger than a minute of its tenant's limit is fanned out in this many slices per minute.
PACE_SLICES = 10
RUN_FUNC = "runner.tasks.execution_run"
FEED_FUNC = "runner.tasks.execution_feed"
WEBHOOK_KIND = "runner.webhook"  # the inbox kind of accepted webhooks

_gate_lock = threading.Lock()
_gate: Gate | None = None
_gate_for: tuple[Any, ...] | None = None


def gate() -> Gate:
    """The process's Gate, one per Redis server and database.

    `jobs.get_connection()` builds a new client on every call, so the Gate is kept by the address
    the client points at, not by the client: a Gate per item job would leave its lease renewer
    thread, and the client (with its socket) that thread holds, behind for the life of a worker
    (a 100,000-item run took ~10,000 sockets, Redis's maxclients)."""
    global _gate, _gate_for
    conn = jobs.get_connection()
    pool = conn.connection_pool
    address = (
        os.getpid(),
        getattr(pool, "service_name", None),  # a Sentinel master's name
        *(pool.connection_kwargs.get(k) for k in ("host", "port", "path", "db")),
    )
    with _gate_lock:
        if _gate is None or _gate_for != address:
            _gate, _gate_for = Gate(conn), address
        return _gate


_TABLE = Execution._meta.db_table
_ITEMS = ExecutionItem._meta.db_table
_EVENTS = WebhookEvent._meta.db_table


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


def event_key(event_id: str) -> str:
    """How a sender's event id is recorded: as it is, or a SHA-256 of it when it is longer than the
    column (200), so two long ids that share a beginning stay two ids. "" stays "" (no id)."""
    if len(event_id) <= EVENT_ID_MAX:
        return event_id
    return "sha256:" + hashlib.sha256(event_id.encode("utf-8", "surrogatepass")).hexdigest()


def content_key(body: bytes) -> str:
    """The event id of a delivery without a sender's id: a SHA-256 of its exact bytes (see
    events_store's "content_id")."""
    return "body-sha256:" + hashlib.sha256(body).hexdigest()


def events_store(
    *,
    handler: Handler,
    organization_id: int,
    trigger: str,
    events: list[dict[str, Any]],
) -> Execution | None:
    """Store incoming events as the items of a new execution; returns only once they are committed.

    The extension point of every push trigger: the webhook intake calls it, and so does a queue
    consumer (AMQP) before it acknowledges its messages. Each event is {"external_id", "payload"}
    and may carry an "event_id": its sender's id for it (a webhook's X-Event-Id, an AMQP
    message_id; never a body's own `id`, which usually names a record that may change again). An
    event whose id this handler and organization have seen (within WEBHOOK_EVENT_KEEP), or that
    repeats an id earlier in `events`, is a redelivery and is not stored again. Ids are compared
    whole (`event_key` hashes a long one, never cuts it).

    An event without a sender's id may carry a "content_id" (`content_key` of its exact bytes) and
    "redelivered" (the broker's flag: it may have been delivered before). Its content id is
    recorded every time, but checked only on a redelivery: a first delivery is always stored (a
    publisher may send the same bytes twice on purpose), a redelivery is stored unless an earlier
    call recorded the same content (then it is the delivery that call stored, given again because
    its acknowledgement was lost).

    The new ids are recorded in the transaction that stores their items, so a concurrent call
    with one of the checked ids raises IntegrityError and stores nothing. Returns None when every
    event was such a duplicate (no execution is created).
    """
    now = timezone.now()
    with transaction.atomic(durable=True):
        fresh = _fresh_events(handler, organization_id, events)
        if events and not fresh.events:
            return None
        execution = Execution.objects.create(
            organization_id=organization_id,
            integration_id=handler.integration_id,
            handler=handler,
            direction=handler.direction,
            trigger=trigger,
            status=Execution.Status.RUNNING,
            started_at=now,
            fanned_out_at=now,
            items_total=len(fresh.events),
            items_remaining=len(fresh.events),
        )
        _event_ids_record(handler, organization_id, execution, fresh)
        items = ExecutionItem.objects.bulk_create(
            [
                ExecutionItem(
                    execution=execution,
                    external_id=str(e.get("external_id") or "")[:200],
                    payload=e.get("payload"),
                )
                for e in fresh.events
            ]
        )
        _fan_out(execution, handler, [i.pk for i in items])
        if not fresh.events:
            _settle(execution.pk)
    bulk.analyze_if_grown(ExecutionItem, len(fresh.events))  # or every item job's claim scans the table
    return execution


@dataclass
class _FreshEvents:
    """What events_store stores of a call's events: the ones not delivered before, the ids to
    record plainly (a concurrent delivery of one meets IntegrityError), and the content ids of first
    deliveries (recorded if absent, never refused)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    checked: dict[str, None] = field(default_factory=dict)
    first_content: dict[str, None] = field(default_factory=dict)


def _fresh_events(handler: Handler, organization_id: int, events: list[dict[str, Any]]) -> _FreshEvents:
    """The events that are not redeliveries (events_store's rules), in the caller's transaction."""
    senders = [event_key(str(e.get("event_id") or "")) for e in events]
    contents = [
        "" if sender else str(e.get("content_id") or "") for sender, e in zip(senders, events, strict=True)
    ]
    checked = [
        bool(s) or bool(c and e.get("redelivered")) for s, c, e in zip(senders, contents, events, strict=True)
    ]
    lookup = {s or c for s, c, check in zip(senders, contents, checked, strict=True) if check}
    recorded = (
        set(
            WebhookEvent.objects.filter(
                handler=handler, organization_id=organization_id, event_id__in=lookup
            ).values_list("event_id", flat=True)
        )
        if lookup
        else set()
    )
    seen = set(recorded)
    fresh = _FreshEvents()
    for sender, content, check, event in zip(senders, contents, checked, events, strict=True):
        if sender:
            if sender in seen:
                continue
            seen.add(sender)
            fresh.checked[sender] = None
        elif content and check:
            if content in recorded:  # only an earlier call's record: two deliveries in this one are two
                continue
            fresh.checked[content] = None
        elif content:
            fresh.first_content[content] = None
        fresh.events.append(event)
    return fresh


def _event_ids_record(
    handler: Handler, organization_id: int, execution: Execution, fresh: _FreshEvents
) -> None:
    """Record the new event ids for `execution`, in the transaction that stores its items."""
    WebhookEvent.objects.bulk_create(
        [
            WebhookEvent(handler=handler, organization_id=organization_id, event_id=i, execution=execution)
            for i in fresh.checked
        ]
    )
    first = [i for i in fresh.first_content if i not in fresh.checked]
    if first:
        # The newest copy's redelivery is what must be recognised: its record is kept from now.
        WebhookEvent.objects.bulk_create(
            [
                WebhookEvent(
                    handler=handler, organization_id=organization_id, event_id=i, execution=execution
                )
                for i in first
            ],
            update_conflicts=True,
            unique_fields=["handler", "organization", "event_id"],
            update_fields=["received_at", "execution"],
        )


def webhook_receive(
    *, handler: Handler, organization_id: int, event_id: str, payload: Any, external_id: str = ""
) -> tuple[int | None, bool]:
    """Accept one webhook event, once per event id; returns (execution id, duplicate).

    One SQL statement, committed through the inbox's group commit (which runs it once for every
    request of the process waiting with this one, `_RECEIVE`): it records the event id (handler,
    organization, id — unique, kept WEBHOOK_EVENT_KEEP; `ON CONFLICT DO NOTHING`) with the
    execution id the event will have (drawn from the executions' sequence), and only if that id
    was new, the event in the inbox (crm/inbox.py). A worker drains the inbox in batches: the
    executions and items in bulk, their item jobs in pipelines (`webhooks_store`), so the request
    makes no Redis round trip and touches none of the execution tables' indexes and foreign keys.
    A retry of an event, even one racing the first delivery (or in the same group commit), stores
    nothing and learns the first execution. Events without an id are accepted every time."""
    key = event_key(event_id)
    row = inbox.write(
        _RECEIVE,
        [
            handler.pk,
            organization_id,
            key,
            str(external_id or event_id)[:200],
            json.dumps(payload),
            timezone.now(),
        ],
    )
    created, earlier = row if row is not None else (None, None)
    if created is not None:
        inbox.notify(WEBHOOK_KIND)
        return created, False
    if earlier is None and key:  # a concurrent delivery committed after this statement's snapshot
        earlier = (
            WebhookEvent.objects.filter(handler=handler, organization_id=organization_id, event_id=key)
            .values_list("execution_id", flat=True)
            .first()
        )
    return earlier, True


# Per request row: whether it created an execution (its id) or repeats an event id recorded before
# it (the first delivery's execution). Within one statement, the first row of an event id is the
# delivery; later rows with that id are its repeats.
_RECEIVE = inbox.Statement(
    f"""
    WITH firsts AS (
        SELECT DISTINCT ON (handler_id, organization_id, event_id) n FROM requests
        WHERE event_id <> '' ORDER BY handler_id, organization_id, event_id, n
    ), ev AS (
        INSERT INTO {_EVENTS} (handler_id, organization_id, event_id, received_at, execution_id)
        SELECT r.handler_id, r.organization_id, r.event_id, r.received_at,
               nextval(pg_get_serial_sequence('{_TABLE}', 'id'))
        FROM requests r JOIN firsts USING (n) ORDER BY n
        ON CONFLICT (handler_id, organization_id, event_id) DO NOTHING
        RETURNING handler_id, organization_id, event_id, execution_id
    ), created AS (
        SELECT r.n, ev.execution_id
        FROM requests r JOIN firsts USING (n) JOIN ev USING (handler_id, organization_id, event_id)
        UNION ALL
        SELECT n, nextval(pg_get_serial_sequence('{_TABLE}', 'id')) FROM requests WHERE event_id = ''
    ), ib AS (
        INSERT INTO {inbox.TABLE} (kind, organization_id, payload, error)
        SELECT '{WEBHOOK_KIND}', r.organization_id, json_build_object(
            'execution_id', c.execution_id, 'handler_id', r.handler_id,
            'organization_id', r.organization_id, 'external_id', r.external_id,
            'payload', r.payload::json)::text, ''
        FROM created c JOIN requests r USING (n) ORDER BY n
    )
    SELECT r.n, c.execution_id, CASE WHEN c.n IS NULL AND r.event_id <> '' THEN COALESCE(
        (SELECT ev.execution_id FROM ev WHERE (ev.handler_id, ev.organization_id, ev.event_id)
            = (r.handler_id, r.organization_id, r.event_id)),
        (SELECT e.execution_id FROM {_EVENTS} e WHERE (e.handler_id, e.organization_id, e.event_id)
            = (r.handler_id, r.organization_id, r.event_id))) END
    FROM requests r LEFT JOIN created c USING (n)
    """,  # noqa: S608 - table names and a constant only
    (
        ("handler_id", "bigint"),
        ("organization_id", "bigint"),
        ("event_id", "text"),
        ("external_id", "text"),
        ("payload", "text"),
        ("received_at", "timestamptz"),
    ),
)


@inbox.register(WEBHOOK_KIND)
def webhooks_store(events: list[inbox.Event]) -> None:
    """The inbox handler of accepted webhooks: their executions (with the ids the requests
    answered) and items in bulk, and the item jobs enqueued in pipelines after commit."""
    accepted = [json.loads(e.payload) for e in events]
    handlers = Handler.objects.select_related("integration").in_bulk({a["handler_id"] for a in accepted})
    now = timezone.now()
    accepted = [a for a in accepted if a["handler_id"] in handlers]  # a handler deleted meanwhile
    executions = Execution.objects.bulk_create(
        [
            Execution(
                pk=a["execution_id"],
                organization_id=a["organization_id"],
                integration_id=handlers[a["handler_id"]].integration_id,
                handler_id=a["handler_id"],
                direction=handlers[a["handler_id"]].direction,
                trigger=Trigger.WEBHOOK,
                status=Execution.Status.RUNNING,
                started_at=now,
                fanned_out_at=now,
                items_total=1,
                items_remaining=1,
            )
            for a in accepted
        ]
    )
    items = ExecutionItem.objects.bulk_create(
        [
            ExecutionItem(execution_id=a["execution_id"], external_id=a["external_id"], payload=a["payload"])
            for a in accepted
        ]
    )
    jobs.enqueue_specs(
        spec
        for execution, item in zip(executions, items, strict=True)
        for spec in _item_specs(execution, handlers[execution.handler_id], [item.pk])
    )
    bulk.analyze_if_grown(ExecutionItem, len(items))


def webhook_events_prune(*, now: datetime | None = None, limit: int = 10_000) -> int:
    """Forget event ids older than WEBHOOK_EVENT_KEEP (at most `limit` per call; the
    runner-event-ids-prune cron calls it until nothing is left)."""
    cutoff = (now or timezone.now()) - WEBHOOK_EVENT_KEEP
    ids = list(WebhookEvent.objects.filter(received_at__lt=cutoff).values_list("id", flat=True)[:limit])
    if ids:
        WebhookEvent.objects.filter(id__in=ids).delete()
    return len(ids)


def _item_queue(trigger: str) -> str:
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


def _item_specs(execution: Execution, handler: Handler, item_ids: list[int]) -> Iterator[jobs.JobSpec]:
    queue = _item_queue(execution.trigger)
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


def _fan_out(execution: Execution, handler: Handler, item_ids: list[int], *, offset: int = 0) -> int:
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
            return jobs.enqueue_specs(_item_specs(execution, handler, item_ids))
        now_ids = item_ids[: max(_pace_slice(limit) - offset, 0)]
        # Items of this run stored before these all have jobs: the feed starts after them.
        execution.fed_through = now_ids[-1] if now_ids else item_ids[0] - 1
        Execution.objects.filter(pk=execution.pk).update(fed_through=execution.fed_through)
        _feeder_enqueue(execution, delay=60 / PACE_SLICES)
        return jobs.enqueue_specs(_item_specs(execution, handler, now_ids))
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
        queue=_item_queue(execution.trigger),
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
            jobs.enqueue_specs(_item_specs(execution, handler, ids))
    if len(ids) < size - waiting and execution.fanned_out_at is not None:
        return "fed"  # every item stored has a job (a run still producing keeps its feeder)
    raise jobs.Defer(every, "next slice")


# --- the RunJob ------------------------------------------------------------------------------

_imports: dict[str, Any] = {}


def _imported(path: str) -> Any:
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
        produce = getattr(_imported(handler.callable_path), "produce", None)
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
            _settle(execution_id, released=1)
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
        _counters(execution.pk, total=len(items), remaining=len(items))
        _fan_out(execution, handler, [i.pk for i in items], offset=execution.items_total)
        execution.items_total += len(items)


# --- the fan-in ------------------------------------------------------------------------------


def _counters(
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


def _settle(
    execution_id: int, *, succeeded: int = 0, failed: int = 0, cancelled: int = 0, released: int = 0
) -> bool:
    """Count finished items; the update that brings `remaining` to 0 completes the run (once)."""
    done = succeeded + failed + cancelled + released
    remaining = _counters(
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


# --- the ItemJob -----------------------------------------------------------------------------


_CLAIMABLE = "(status = 'pending' OR (status = 'running' AND started_at < %s))"
_CLAIMABLE_T = "(t.status = 'pending' OR (t.status = 'running' AND t.started_at < %s))"


def _claim(item_ids: list[int], now: datetime, limit: int | None = None) -> list[tuple[int, str, Any, int]]:
    """pending → running (attempts+1) for the first `limit` ids still pending (or abandoned by a dead
    worker), in id order, in one statement. The outer WHERE re-checks the status under the row lock,
    so two jobs never claim the same item; SKIP LOCKED makes a concurrent claimer pass over it."""
    placeholders = ",".join(["%s"] * len(item_ids))
    stale = now - STALE_CLAIM
    with connection.cursor() as cur:
        cur.execute(
            # The CTE is evaluated once (a LIMIT inside `id IN (subquery)` may be re-run per row).
            f"WITH picked AS (SELECT id FROM {_ITEMS} WHERE id IN ({placeholders}) AND {_CLAIMABLE} "  # noqa: S608
            "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) "
            f"UPDATE {_ITEMS} AS t SET status = 'running', attempts = attempts + 1, started_at = %s "
            f"FROM picked WHERE t.id = picked.id AND {_CLAIMABLE_T} "
            "RETURNING t.id, t.external_id, t.payload, t.attempts",
            [*item_ids, stale, limit or len(item_ids), now, stale],
        )
        claimed = cur.fetchall()
    return [
        (r[0], r[1], json.loads(r[2]) if isinstance(r[2], str) else r[2], r[3])
        for r in sorted(claimed, key=lambda r: r[0])
    ]


def _claimable(item_ids: list[int]) -> list[int]:
    """The ids of a group still to be processed (a deferred group asks admission only for those)."""
    placeholders = ",".join(["%s"] * len(item_ids))
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id FROM {_ITEMS} WHERE id IN ({placeholders}) AND {_CLAIMABLE} ORDER BY id",  # noqa: S608
            [*item_ids, timezone.now() - STALE_CLAIM],
        )
        return [r[0] for r in cur.fetchall()]


def _call_python(path: str, items: list[ItemIn], batch: bool) -> list[ItemOutcome]:
    target = _imported(path)
    process_batch = getattr(target, "process_batch", None) if batch else None
    if process_batch is not None:
        try:
            return list(process_batch(items))
        except IntegrationError as exc:
            return [
                ItemOutcome(i.item_id, False, exc.retryable, str(exc), systemic=exc.retryable) for i in items
            ]
        except Exception as exc:  # the handler's own bug or outage: retried, counted by the breaker
            return [
                ItemOutcome(i.item_id, False, True, f"{type(exc).__name__}: {exc}", systemic=True)
                for i in items
            ]
    process = getattr(target, "process", target)
    outcomes = []
    for item in items:
        try:
            outcomes.append(ItemOutcome(item.item_id, True, result=process(item)))
        except IntegrationError as exc:
            outcomes.append(ItemOutcome(item.item_id, False, exc.retryable, str(exc), systemic=exc.retryable))
        except Exception as exc:
            outcomes.append(
                ItemOutcome(item.item_id, False, True, f"{type(exc).__name__}: {exc}", systemic=True)
            )
    return outcomes


def items_process(
    *,
    execution_id: int,
    item_ids: list[int],
    organization_id: int,
    integration_key: str,
    handler_key: str,
    direction: str,
    rerun: bool = True,
) -> str:
    """Process one item, a batch, or a group of single items: limits, breaker, claim, call, record.

    Raises Defer to wait. A group is admitted item by item (partial admission: the items the
    limits refuse, and all but the probe while half-open, wait in a Defer of the same job) and its
    items are called one at a time, stopping at the first systemic failure (the breaker sees one
    failed call; the items not called go back to pending with their attempt given back).
    `rerun` (a deferred or retried job): first narrow the group to the items still to do.
    """
    integration, handler, tenant = cache.load(integration_key, handler_key, organization_id)
    if integration is None or handler is None:
        return _cancel_items(execution_id, item_ids, reason="integration or handler deleted")
    if not integration["enabled"] or handler["paused"]:
        raise jobs.Defer(conf.get("RUNNER_PAUSE_DEFER"), "handler paused")
    batch = handler["batch_size"] > 1
    if rerun and not batch and len(item_ids) > 1:
        item_ids = _claimable(item_ids)
        if not item_ids:
            return "nothing to claim"
    g = gate()
    policy = conf.breaker_policy()
    admission = _admit(
        g,
        policy,
        integration_key=integration_key,
        handler=handler,
        tenant=tenant,
        organization_id=organization_id,
        n=len(item_ids),
        batch=batch,
    )
    plan: ItemsPlan | None = None
    try:
        items = items_claim(
            item_ids=item_ids,
            limit=None if batch else admission.count,
            execution_id=execution_id,
            direction=direction,
            integration_key=integration_key,
            handler_key=handler_key,
            organization_id=organization_id,
        )
        if not items:
            return "nothing to claim"
        outcomes = items_send(handler=handler, items=items, batch=batch)
        plan = items_classify(items=items, outcomes=outcomes, max_attempts=MAX_ATTEMPTS)
        items_apply(execution_id=execution_id, plan=plan)
    finally:
        g.finish(
            admission,
            integration_key=integration_key,
            handler_id=handler["id"],
            outcome=plan.breaker_outcome if plan else "none",
            policy=policy,
        )
    if plan.retry_attempt:
        raise jobs.Defer(conf.get("RUNNER_RETRY_BACKOFF") * 2 ** (plan.retry_attempt - 1), "retry")
    if plan.released:
        raise jobs.Defer(conf.get("RUNNER_RETRY_BACKOFF"), "rest of the group")
    if not batch and admission.count < len(item_ids):
        # The items partial admission left out wait in this same job.
        raise jobs.Defer(max(admission.wait, 0.5), "rest of the group")
    return "done"


def _admit(
    g: Gate,
    policy: BreakerPolicy,
    *,
    integration_key: str,
    handler: dict[str, Any],
    tenant: dict[str, Any],
    organization_id: int,
    n: int,
    batch: bool,
) -> Admission:
    """Admission for `n` items (a group may get fewer) by the breaker, the handler's concurrency and
    rate and the tenant's window; raises Defer when none is admitted."""
    admission = g.admit(
        integration_key=integration_key,
        handler_id=handler["id"],
        organization_id=organization_id,
        n=n,
        tenant_limit=tenant["rate_limit_per_minute"],
        handler_limit=handler["rate_limit_per_minute"],
        concurrency=handler["concurrency"],
        lease_ms=int(conf.get("RUNNER_LEASE_SECONDS") * 1000),
        policy=policy,
        partial=not batch,
    )
    if not admission.admitted:
        wait = conf.get("RUNNER_TENANT_DEFER") if admission.reason == "tenant rate limit" else admission.wait
        raise jobs.Defer(wait, admission.reason)
    return admission


def items_claim(
    *,
    item_ids: list[int],
    limit: int | None,
    execution_id: int,
    direction: str,
    integration_key: str,
    handler_key: str,
    organization_id: int,
) -> list[ItemIn]:
    """Claim the first `limit` of `item_ids` still to do (all when None) and return them as the
    handler's input, attempt counted; an item another job holds is left out."""
    return [
        ItemIn(
            item_id=i,
            execution_id=execution_id,
            external_id=ext,
            payload=payload,
            attempt=attempts,
            direction=direction,
            integration_key=integration_key,
            handler_key=handler_key,
            organization_id=organization_id,
        )
        for i, ext, payload, attempts in _claim(item_ids, timezone.now(), limit)
    ]


def items_send(*, handler: dict[str, Any], items: list[ItemIn], batch: bool) -> list[ItemOutcome]:
    """Call the handler, outside any transaction: once for a batch, else item by item, stopping
    after the first systemic failure (an outage: the rest of the group is not called)."""
    call = _caller(handler, batch)
    if batch:
        return list(call(items))
    outcomes: list[ItemOutcome] = []
    for item in items:
        outcomes.extend(call([item]))
        if outcomes[-1].systemic:
            break
    return outcomes


def _caller(handler: dict[str, Any], batch: bool) -> Any:
    """A function items → outcomes calling the handler once (one item, or one batch)."""
    if handler["kind"] != Handler.Kind.HTTP:
        return lambda items: _call_python(handler["callable_path"], items, batch)
    auth = ""
    if handler["auth_header"]:
        auth = Handler.objects.only("auth_value_encrypted").get(pk=handler["id"]).auth_value()
    return lambda items: client.process(
        handler["endpoint_url"], items, auth_header=handler["auth_header"], auth_value=auth, batch=batch
    )


def items_apply(*, execution_id: int, plan: ItemsPlan) -> None:
    """Write `plan` and the fan-in counters in one transaction. Only items still running change, and
    the counters add what the updates changed, so a plan applied twice counts once."""
    now = timezone.now()
    running = ExecutionItem.objects.filter(status=ExecutionItem.Status.RUNNING)
    done = {"status": ExecutionItem.Status.SUCCEEDED, "finished_at": now, "last_error": ""}
    with transaction.atomic():
        succeeded = failed = 0
        if plan.succeeded:
            succeeded += running.filter(id__in=plan.succeeded).update(**done)
        for item_id, result in plan.succeeded_with_result:
            succeeded += running.filter(id=item_id).update(**done, result=result)
        for error, ids in plan.dlq.items():
            failed += running.filter(id__in=ids).update(
                status=ExecutionItem.Status.FAILED, finished_at=now, dlq_at=now, last_error=error
            )
        for error, ids in plan.retry.items():
            running.filter(id__in=ids).update(status=ExecutionItem.Status.PENDING, last_error=error)
        if plan.released:
            running.filter(id__in=plan.released).update(
                status=ExecutionItem.Status.PENDING, attempts=F("attempts") - 1
            )
        if succeeded or failed:
            _settle(execution_id, succeeded=succeeded, failed=failed)


def _cancel_items(execution_id: int, item_ids: list[int], *, reason: str) -> str:
    with transaction.atomic():
        n = ExecutionItem.objects.filter(id__in=item_ids, status=ExecutionItem.Status.PENDING).update(
            status=ExecutionItem.Status.CANCELLED, finished_at=timezone.now(), last_error=reason
        )
        if n:
            _settle(execution_id, cancelled=n)
    return "cancelled"


# --- operator actions ------------------------------------------------------------------------
def execution_cancel(*, execution: Execution) -> int:
    """Cancel every pending item of a run (in-flight ones finish); returns how many."""
    with transaction.atomic():
        n = ExecutionItem.objects.filter(execution=execution, status=ExecutionItem.Status.PENDING).update(
            status=ExecutionItem.Status.CANCELLED, finished_at=timezone.now(), last_error="cancelled"
        )
        _counters(execution.pk, remaining=-n, cancelled=n)
        Execution.objects.filter(
            pk=execution.pk, status__in=[Execution.Status.PENDING, Execution.Status.RUNNING]
        ).update(status=Execution.Status.CANCELLED, finished_at=timezone.now())
    return n


def items_replay(*, item_ids: Iterable[int], progress: Callable[[int], None] | None = None) -> int:
    """Put DLQ items back as pending (a new attempt each) and enqueue them; returns how many.

    `progress(n)` is told after each execution's items how many of the ids were handled."""
    rows = list(
        ExecutionItem.objects.filter(
            id__in=list(item_ids), status=ExecutionItem.Status.FAILED, dlq_at__isnull=False
        ).values_list("execution_id", "id")
    )
    by_execution: dict[int, list[int]] = defaultdict(list)
    for execution_id, item_id in rows:
        by_execution[execution_id].append(item_id)
    total = 0
    executions = Execution.objects.select_related("handler__integration").in_bulk(list(by_execution))
    for execution_id, ids in by_execution.items():
        with transaction.atomic():
            ids_done = list(
                ExecutionItem.objects.select_for_update()
                .filter(id__in=ids, status=ExecutionItem.Status.FAILED, dlq_at__isnull=False)
                .values_list("id", flat=True)
            )
            if ids_done:
                ExecutionItem.objects.filter(id__in=ids_done).update(
                    status=ExecutionItem.Status.PENDING, dlq_at=None, finished_at=None
                )
                _counters(execution_id, remaining=len(ids_done), failed=-len(ids_done))
                Execution.objects.filter(pk=execution_id).update(
                    status=Execution.Status.RUNNING, finished_at=None
                )
                execution = executions[execution_id]
                _fan_out(execution, execution.handler, sorted(ids_done))
                total += len(ids_done)
        if progress:
            progress(len(ids))
    return total


def dlq_items(*, handler: Handler | None = None, execution: Execution | None = None) -> list[int]:
    qs = ExecutionItem.objects.filter(dlq_at__isnull=False, status=ExecutionItem.Status.FAILED)
    if handler is not None:
        qs = qs.filter(execution__handler=handler)
    if execution is not None:
        qs = qs.filter(execution=execution)
    return list(qs.order_by("id").values_list("id", flat=True))


def handler_set_paused(*, handler: Handler, paused: bool) -> None:
    handler.paused = paused
    handler.save(update_fields=["paused"])  # post_save invalidates the cache


def integration_reset_circuit(*, integration: IntegrationType) -> None:
    gate().breaker_reset(integration.integration_key)


# --- schedule trigger ------------------------------------------------------------------------
def schedules_dispatch(*, now: datetime | None = None, lookback: timedelta = timedelta(minutes=2)) -> int:
    """Start one execution per due cron occurrence of each scheduled handler, in each organization's
    time zone, exactly once per occurrence (a JobRun per occurrence). Returns how many were started."""
    from zoneinfo import ZoneInfo

    from croniter import croniter

    from crm.models import JobRun, Organization

    now = now or timezone.now()
    started = 0
    handlers = (
        Handler.objects.select_related("integration")
        .exclude(schedule_cron="")
        .filter(integration__enabled=True)
    )
    for handler in handlers:
        if not croniter.is_valid(handler.schedule_cron):
            continue
        orgs = (
            Organization.objects.all()
            if handler.organization_id is None
            else Organization.objects.filter(pk=handler.organization_id)
        )
        for org in orgs.only("id", "timezone"):
            tz = ZoneInfo(org.timezone or "America/Sao_Paulo")
            it = croniter(handler.schedule_cron, (now - lookback).astimezone(tz))
            while (when := it.get_next(datetime)) <= now:
                key = f"{handler.pk}:{org.pk}:{when.astimezone(tz).isoformat()}"
                with transaction.atomic():
                    _run, created = JobRun.objects.get_or_create(
                        kind="runner-schedule",
                        key=key,
                        defaults={
                            "organization_id": org.pk,
                            "status": JobRun.Status.COMPLETED,
                            "finished_at": now,
                        },
                    )
                    if created:
                        execution_start(handler=handler, organization_id=org.pk, trigger="schedule")
                        started += 1
    return started


# --- giving up: work that cannot succeed ends ----------------------------------------------------
@recovery.gives_up(ITEM_FUNC)
def _items_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    """An ItemJob that cannot succeed: its unfinished items go to the DLQ with the reason."""
    now = timezone.now()
    with transaction.atomic():
        failed = ExecutionItem.objects.filter(
            id__in=kwargs["item_ids"],
            execution_id=kwargs["execution_id"],
            status__in=[ExecutionItem.Status.PENDING, ExecutionItem.Status.RUNNING],
        ).update(status=ExecutionItem.Status.FAILED, finished_at=now, dlq_at=now, last_error=reason)
        if failed:
            _settle(kwargs["execution_id"], failed=failed)


@recovery.gives_up(RUN_FUNC)
@recovery.gives_up(FEED_FUNC)
def _execution_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    """A run (or its feeder) that cannot go on: FAILED with the reason, its pending items cancelled."""
    execution_id = kwargs["execution_id"]
    now = timezone.now()
    with transaction.atomic():
        n = ExecutionItem.objects.filter(
            execution_id=execution_id, status=ExecutionItem.Status.PENDING
        ).update(status=ExecutionItem.Status.CANCELLED, finished_at=now, last_error=reason)
        _counters(execution_id, remaining=-n, cancelled=n)
        Execution.objects.filter(
            pk=execution_id, status__in=[Execution.Status.PENDING, Execution.Status.RUNNING]
        ).update(status=Execution.Status.FAILED, finished_at=now, error=reason)


# --- recovery: the database says what is unfinished --------------------------------------------
@recovery.register("runner")
def _unfinished() -> Iterator[jobs.JobSpec]:
    old = timezone.now() - recovery.MIN_AGE
    runs = Execution.objects.filter(
        status__in=[Execution.Status.PENDING, Execution.Status.RUNNING], created_at__lt=old
    ).select_related("handler__integration")
    for execution in runs.iterator(chunk_size=500):
        if execution.fanned_out_at is None:
            yield jobs.JobSpec(
                func=RUN_FUNC,
                queue=queues.RUNS,
                kwargs={"execution_id": execution.pk},
                job_id=f"runner-run-{execution.pk}",
                organization_id=execution.organization_id,
            )
        pending = ExecutionItem.objects.filter(
            execution=execution, status=ExecutionItem.Status.PENDING, created_at__lt=old
        )
        if execution.fed_through is not None:
            # A paced run: its feeder enqueues the items it has not reached yet.
            yield jobs.JobSpec(
                func=FEED_FUNC,
                queue=_item_queue(execution.trigger),
                kwargs={"execution_id": execution.pk},
                job_id=f"runner-feed-{execution.pk}",
                organization_id=execution.organization_id,
            )
            pending = pending.filter(id__lte=execution.fed_through)
        ids = list(pending.order_by("id").values_list("id", flat=True))
        ids += list(
            ExecutionItem.objects.filter(
                execution=execution,
                status=ExecutionItem.Status.RUNNING,
                started_at__lt=timezone.now() - STALE_CLAIM,
            ).values_list("id", flat=True)
        )
        if ids:
            yield from _item_specs(execution, execution.handler, ids)
