"""The recovery pass: work the database says is unfinished but Redis no longer holds is re-enqueued.

PostgreSQL is the source of truth and Redis only transport, so losing Redis (a restart without
persistence, a flush, a failover) must lose nothing. Each app registers a recoverer that yields
JobSpecs (with deterministic job ids) for its unfinished rows; the pass checks those ids in Redis
in bulk and re-enqueues only the ones no longer queued, delayed or running. The jobs themselves
are idempotent (claims in the database), so a recovered job never sends twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from itertools import islice

from django.conf import settings
from django.utils import timezone

from crm import jobs
from crm.models import JobRun

logger = logging.getLogger(__name__)

Recoverer = Callable[[], Iterable[jobs.JobSpec]]
_RECOVERERS: dict[str, Recoverer] = {}

# A run this young may still be waiting for its enqueue-on-commit; leave it alone.
MIN_AGE = timedelta(seconds=30)
# A run re-dispatched this many times is given up as failed (a job that kills its worker
# every time must not loop forever).
MAX_ATTEMPTS = 5


def register(name: str) -> Callable[[Recoverer], Recoverer]:
    """Decorator: `@recovery.register("whatsapp-messages")` on a function yielding JobSpecs."""

    def deco(fn: Recoverer) -> Recoverer:
        _RECOVERERS[name] = fn
        return fn

    return deco


def _chunks(iterable: Iterable[jobs.JobSpec], size: int) -> Iterator[list[jobs.JobSpec]]:
    it = iter(iterable)
    while chunk := list(islice(it, size)):
        yield chunk


def _purge(job_ids: list[str], queues_: list[str]) -> None:
    """Drop dead jobs' leftovers (finished/failed entries) so their ids can be enqueued again."""
    connection = jobs.get_connection()
    with connection.pipeline(transaction=False) as pipe:
        for jid, q in zip(job_ids, queues_, strict=True):
            pipe.delete(f"rq:job:{jid}")
            for registry in ("failed", "finished", "canceled"):
                pipe.zrem(f"rq:{registry}:{q}", jid)
        pipe.execute()


def requeue_missing(specs: Iterable[jobs.JobSpec], *, dry_run: bool = False) -> int:
    """Re-enqueue the specs whose job is not alive in Redis; returns how many."""
    total = 0
    for chunk in _chunks(specs, jobs.BULK_CHUNK):
        for s in chunk:
            if not s.job_id:
                raise ValueError(f"recoverable job {s.func} on {s.queue} needs a deterministic job_id")
        alive = jobs.jobs_alive([s.job_id for s in chunk if s.job_id])
        missing = [s for s, ok in zip(chunk, alive, strict=True) if not ok]
        if missing and not dry_run:
            _purge([s.job_id or "" for s in missing], [s.queue for s in missing])
            jobs.enqueue_specs(missing)
        total += len(missing)
    return total


def _stale_job_runs(*, dry_run: bool) -> list[jobs.JobSpec]:
    """JobRuns still `running` whose job is gone (lost with Redis, or abandoned and out of retries)."""
    now = timezone.now()
    stale_after = timedelta(seconds=settings.CRM_STALE_RUN_AFTER)
    runs = list(
        JobRun.objects.filter(status=JobRun.Status.RUNNING, started_at__lt=now - MIN_AGE)
        .exclude(func="")
        .only(
            "id",
            "kind",
            "key",
            "func",
            "queue",
            "kwargs",
            "job_id",
            "attempts",
            "started_at",
            "organization_id",
        )
        .order_by("id")[:10_000]
    )
    if not runs:
        return []
    connection = jobs.get_connection()
    with connection.pipeline(transaction=False) as pipe:
        for run in runs:
            pipe.exists(f"rq:job:{run.job_id}")
        exists = pipe.execute()
    alive = jobs.jobs_alive([r.job_id for r in runs])
    specs: list[jobs.JobSpec] = []
    for run, present, live in zip(runs, exists, alive, strict=True):
        if live:
            continue
        # A job that vanished (Redis lost it) is recovered at once; one that is still in Redis
        # but dead (failed after its worker was killed) waits CRM_STALE_RUN_AFTER first.
        if present and run.started_at > now - stale_after:
            continue
        if run.attempts >= MAX_ATTEMPTS:
            if not dry_run:
                JobRun.objects.filter(pk=run.pk, status=JobRun.Status.RUNNING).update(
                    status=JobRun.Status.FAILED,
                    finished_at=now,
                    error=f"given up by recovery after {run.attempts} attempts",
                )
            continue
        specs.append(
            jobs.JobSpec(
                func=run.func,
                queue=run.queue,
                kwargs=run.kwargs,
                job_id=run.job_id,
                description=f"recovered {run.kind}:{run.key}",
                organization_id=run.organization_id,
            )
        )
    return specs


def recover(*, dry_run: bool = False) -> dict[str, int]:
    """Run every recoverer; returns {recoverer: jobs re-enqueued}. Safe to run any time, twice."""
    result = {"job-runs": requeue_missing(_stale_job_runs(dry_run=dry_run), dry_run=dry_run)}
    for name, recoverer in _RECOVERERS.items():
        result[name] = requeue_missing(recoverer(), dry_run=dry_run)
    if any(result.values()):
        logger.warning("recovery re-enqueued %s", result, extra={"recovered": result})
    return result
