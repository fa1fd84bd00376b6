"""RQ job functions of the integration runner: take ids, call services."""

from __future__ import annotations

from rq import get_current_job

from runner import events, executions, items, schedules


def execution_run(execution_id: int) -> str:
    """RunJob (queue `runs`): produce a run's items and fan them out. Safe to run twice."""
    job = get_current_job()
    last_attempt = job is None or not job.retries_left
    return executions.execution_run(execution_id=execution_id, last_attempt=last_attempt)


def execution_feed(execution_id: int) -> str:
    """Feeder of a paced run (its items' queue): the next slice of its items; Defers until all are fed."""
    return executions.execution_feed(execution_id=execution_id)


def items_process(
    execution_id: int,
    item_ids: list[int],
    organization_id: int,
    integration_key: str,
    handler_key: str,
    direction: str,
) -> str:
    """ItemJob (queues `items-p*`): process one item, a batch or a group; Defers without spending attempts."""
    job = get_current_job()
    # A deferred job narrows its group to what is left before asking the limits (after an RQ retry
    # it asks for the whole group: the windows over-count a little, never under-count).
    rerun = job is None or bool(job.meta.get("deferrals"))
    return items.items_process(
        execution_id=execution_id,
        item_ids=item_ids,
        organization_id=organization_id,
        integration_key=integration_key,
        handler_key=handler_key,
        direction=direction,
        rerun=rerun,
    )


def schedules_dispatch() -> int:
    """Cron (every minute): start the executions of due handler schedules, once per occurrence."""
    return schedules.schedules_dispatch()


def webhook_events_prune() -> int:
    """Cron (every 10 minutes): forget event ids past their keep (a slow or failed prune never
    holds up the schedules), 10,000 per statement until none is left."""
    total = 0
    while pruned := events.webhook_events_prune():
        total += pruned
    return total
