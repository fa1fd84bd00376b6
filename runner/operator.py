"""What an operator does to the runner: cancel a run, replay DLQ items, pause a handler, reset a
breaker."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable

from django.db import transaction
from django.utils import timezone

from runner.executions import counters, fan_out
from runner.items import gate
from runner.models import (
    Execution,
    ExecutionItem,
    Handler,
    IntegrationType,
)

logger = logging.getLogger(__name__)


# --- operator actions ------------------------------------------------------------------------
def execution_cancel(*, execution: Execution) -> int:
    """Cancel every pending item of a run (in-flight ones finish); returns how many."""
    with transaction.atomic():
        n = ExecutionItem.objects.filter(execution=execution, status=ExecutionItem.Status.PENDING).update(
            status=ExecutionItem.Status.CANCELLED, finished_at=timezone.now(), last_error="cancelled"
        )
        counters(execution.pk, remaining=-n, cancelled=n)
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
                counters(execution_id, remaining=len(ids_done), failed=-len(ids_done))
                Execution.objects.filter(pk=execution_id).update(
                    status=Execution.Status.RUNNING, finished_at=None
                )
                execution = executions[execution_id]
                fan_out(execution, execution.handler, sorted(ids_done))
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
