"""The runner's part in recovery: what the database says is unfinished (re-enqueued by
crm.recovery), and work that cannot succeed ended (its items to the DLQ, its run failed). Registered
in RunnerConfig.ready."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import transaction
from django.utils import timezone

from crm import jobs, queues, recovery
from runner.executions import FEED_FUNC, RUN_FUNC, counters, item_queue, item_specs, settle
from runner.items import STALE_CLAIM
from runner.models import (
    Execution,
    ExecutionItem,
)

logger = logging.getLogger(__name__)


# --- giving up: work that cannot succeed ends ----------------------------------------------------
def items_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    """An ItemJob that cannot succeed: its unfinished items go to the DLQ with the reason."""
    now = timezone.now()
    with transaction.atomic():
        failed = ExecutionItem.objects.filter(
            id__in=kwargs["item_ids"],
            execution_id=kwargs["execution_id"],
            status__in=[ExecutionItem.Status.PENDING, ExecutionItem.Status.RUNNING],
        ).update(status=ExecutionItem.Status.FAILED, finished_at=now, dlq_at=now, last_error=reason)
        if failed:
            settle(kwargs["execution_id"], failed=failed)


def execution_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    """A run (or its feeder) that cannot go on: FAILED with the reason, its pending items cancelled."""
    execution_id = kwargs["execution_id"]
    now = timezone.now()
    with transaction.atomic():
        n = ExecutionItem.objects.filter(
            execution_id=execution_id, status=ExecutionItem.Status.PENDING
        ).update(status=ExecutionItem.Status.CANCELLED, finished_at=now, last_error=reason)
        counters(execution_id, remaining=-n, cancelled=n)
        Execution.objects.filter(
            pk=execution_id, status__in=[Execution.Status.PENDING, Execution.Status.RUNNING]
        ).update(status=Execution.Status.FAILED, finished_at=now, error=reason)


# --- recovery: the database says what is unfinished --------------------------------------------
def unfinished() -> Iterator[jobs.JobSpec]:
    """Every run and item the database says is unfinished and old enough, as the jobs to re-enqueue."""
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
                queue=item_queue(execution.trigger),
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
            yield from item_specs(execution, execution.handler, ids)
