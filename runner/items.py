"""The ItemJob: admission (breaker, concurrency, rate and tenant window), the claim, the call to the
handler outside any transaction, and its outcome written with the fan-in counters."""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from crm import jobs
from crm.resilience import Admission, BreakerPolicy, Gate
from integrations.errors import IntegrationError
from integrations.runner import client
from integrations.runner.contract import ItemIn, ItemOutcome
from runner import cache, conf
from runner.executions import imported, settle
from runner.models import (
    MAX_ATTEMPTS,
    ExecutionItem,
    Handler,
)
from runner.plan import ItemsPlan, items_classify

logger = logging.getLogger(__name__)

# An item claimed this long ago by a job that never reported back (its worker died) may be claimed again.
STALE_CLAIM = timedelta(minutes=10)

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


_ITEMS = ExecutionItem._meta.db_table

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
    target = imported(path)
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
        if admission.reason == "tenant rate limit":
            # The whole tenant waits (its window is the organization's): parked, not re-picked.
            raise jobs.Park(conf.get("RUNNER_TENANT_DEFER"), admission.reason)
        raise jobs.Defer(admission.wait, admission.reason)
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
            settle(execution_id, succeeded=succeeded, failed=failed)


def _cancel_items(execution_id: int, item_ids: list[int], *, reason: str) -> str:
    with transaction.atomic():
        n = ExecutionItem.objects.filter(id__in=item_ids, status=ExecutionItem.Status.PENDING).update(
            status=ExecutionItem.Status.CANCELLED, finished_at=timezone.now(), last_error=reason
        )
        if n:
            settle(execution_id, cancelled=n)
    return "cancelled"
