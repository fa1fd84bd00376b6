"""The recovery pass: work the database says is unfinished but Redis no longer holds is re-enqueued.

PostgreSQL is the source of truth and Redis only transport, so losing Redis (a restart without
persistence, a flush, a failover) must lose nothing. Each app registers a recoverer that yields
JobSpecs (with deterministic job ids) for its unfinished rows; the pass checks those ids in Redis
in bulk and re-enqueues only the ones no longer queued, delayed or running. The jobs themselves
are idempotent (claims in the database), so a recovered job never sends twice.

Work that cannot succeed ends for good, and the pass never revives it. Each app registers, per
job function, how its work ends (`@recovery.gives_up(func)`: messages FAILED with the reason, a
campaign stopped, items to the DLQ). It is called when
- a job fails its last attempt with an error that is not transient (a bug, a configuration error
  such as a secret encrypted under a retired key): at once, from RQ's failure callback, which
  every job enqueued through crm.jobs carries (`job_failed`);
- a job that failed (transient-looking errors, a worker killed by the job every time) has been
  revived MAX_REVIVALS times by this pass within a day: instead of a sixth revival.
A transient error (database or Redis unreachable, a worker that died) leaves the work to this
pass, which runs it again when the outage is over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from itertools import islice
from typing import Any

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.utils import timezone
from rq.exceptions import AbandonedJobError
from rq.job import Job
from rq.timeouts import JobTimeoutException

from crm import jobs, retired, services
from crm.models import JobRun

logger = logging.getLogger(__name__)

Recoverer = Callable[[], Iterable[jobs.JobSpec]]
_RECOVERERS: dict[str, Recoverer] = {}

# A run this young may still be waiting for its enqueue-on-commit; leave it alone.
MIN_AGE = timedelta(seconds=30)
# A run re-dispatched this many times is given up as failed (a job that kills its worker
# every time must not loop forever).
MAX_ATTEMPTS = 5
# A failed job revived this many times within REVIVALS_WINDOW is given up instead.
MAX_REVIVALS = 5
REVIVALS_WINDOW = 24 * 3600

# Failures that say nothing about the work itself: it runs again when they pass. A job killed by a
# timeout or with its worker may be poison too; MAX_REVIVALS bounds those.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    redis.ConnectionError,
    redis.TimeoutError,
    AbandonedJobError,
    JobTimeoutException,
    ConnectionError,
    TimeoutError,
)

GiveUp = Callable[[dict[str, Any], str, "BaseException | None"], None]
_GIVE_UPS: dict[str, GiveUp] = {}


def register(name: str) -> Callable[[Recoverer], Recoverer]:
    """Decorator: `@recovery.register("whatsapp-messages")` on a function yielding JobSpecs."""

    def deco(fn: Recoverer) -> Recoverer:
        _RECOVERERS[name] = fn
        return fn

    return deco


def gives_up(func: str) -> Callable[[GiveUp], GiveUp]:
    """Decorator: how the work of job function `func` ends for good. The function gets the job's
    kwargs, the reason (for the operator) and the error (None when the pass gave up reviving);
    it must be safe to call twice and must leave nothing for a recoverer to yield."""

    def deco(fn: GiveUp) -> GiveUp:
        _GIVE_UPS[func] = fn
        return fn

    return deco


def give_up(*, func: str, kwargs: dict[str, Any], reason: str, error: BaseException | None = None) -> None:
    """End the work of one job for good (its app's `gives_up` function); logged as an error."""
    logger.error("giving up %s %s: %s", func, kwargs, reason, extra={"func": func, "reason": reason})
    handler = _GIVE_UPS.get(func)
    if handler is None:
        logger.error("no gives_up function for %s: its work stays as it is", func)
        return
    handler(kwargs, reason, error)


def job_failed(job: Job, connection: Any, exc_type: type, exc_value: BaseException, tb: Any) -> None:
    """RQ's failure callback (every job of crm.jobs): the last attempt's non-transient error ends
    the job's work now. Never raises: a failure here must not disturb the worker or its sweeps."""
    if isinstance(exc_value, (jobs.Defer, *TRANSIENT_ERRORS)) or job.retries_left:
        return
    reason = f"{exc_type.__name__} on its last attempt: {exc_value}"[:2000]
    try:
        give_up(func=job.func_name or "", kwargs=dict(job.kwargs or {}), reason=reason, error=exc_value)
    except Exception:
        logger.exception("giving up job %s failed; the recovery pass will try again", job.id)


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


def requeue_missing(
    specs: Iterable[jobs.JobSpec], *, dry_run: bool = False, progress: Callable[[int], None] | None = None
) -> int:
    """Re-enqueue the specs whose job is not alive in Redis; returns how many. A job that failed
    and was revived MAX_REVIVALS times already is given up instead (see the module's docstring).

    `progress(n)` is told after each chunk how many more specs were checked."""
    total = 0
    for chunk in _chunks(specs, jobs.BULK_CHUNK):
        for s in chunk:
            if not s.job_id:
                raise ValueError(f"recoverable job {s.func} on {s.queue} needs a deterministic job_id")
        alive = jobs.jobs_alive([s.job_id for s in chunk if s.job_id])
        missing = [s for s, ok in zip(chunk, alive, strict=True) if not ok]
        if missing and not dry_run:
            missing = _revivable(missing)
            _purge([s.job_id or "" for s in missing], [s.queue for s in missing])
            jobs.enqueue_specs(missing)
        total += len(missing)
        if progress:
            progress(len(chunk))
    return total


def _revivable(specs: list[jobs.JobSpec]) -> list[jobs.JobSpec]:
    """The specs to enqueue again: all but the failed jobs revived too often, which are given up."""
    connection = jobs.get_connection()
    with connection.pipeline(transaction=False) as pipe:
        for s in specs:
            pipe.hget(f"rq:job:{s.job_id}", "status")
        statuses = pipe.execute()
    failed = [s for s, status in zip(specs, statuses, strict=True) if status == b"failed"]
    if not failed:
        return specs
    with connection.pipeline(transaction=False) as pipe:
        for s in failed:
            pipe.incr(f"crm:revivals:{s.job_id}")
            pipe.expire(f"crm:revivals:{s.job_id}", REVIVALS_WINDOW, nx=True)
        counts = pipe.execute()[::2]
    hopeless = {s.job_id for s, n in zip(failed, counts, strict=True) if int(n) > MAX_REVIVALS}
    for s in failed:
        if s.job_id in hopeless:
            give_up(
                func=s.func,
                kwargs=s.kwargs,
                reason=f"failed again after {MAX_REVIVALS} recoveries: {_last_error(s.job_id or '')}"[:2000],
            )
    return [s for s in specs if s.job_id not in hopeless]


def _last_error(job_id: str) -> str:
    """The last line of the job's latest traceback, or '' when Redis has none."""
    try:
        result = Job.fetch(job_id, connection=jobs.get_connection(), serializer=jobs.JSONSerializer)
        latest = result.latest_result()
    except Exception:  # the job's data may be gone or unreadable: the reason is only a label
        return ""
    text = (latest.exc_string or "") if latest is not None else ""
    return text.strip().splitlines()[-1] if text.strip() else ""


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


def recover(*, dry_run: bool = False, progress: Callable[[str, int], None] | None = None) -> dict[str, int]:
    """Run every recoverer; returns {recoverer: jobs re-enqueued}. Safe to run any time, twice.

    `progress(recoverer, n)` is told as each recoverer's specs are checked, n more at a time."""

    def told(name: str) -> Callable[[int], None] | None:
        return (lambda n: progress(name, n)) if progress else None

    if not dry_run:
        # The fair queues' weights first, so the work enqueued below is served at its share.
        services.queue_weights_rebuild()
        retired.move_retired()
    result = {
        "job-runs": requeue_missing(
            _stale_job_runs(dry_run=dry_run), dry_run=dry_run, progress=told("job-runs")
        )
    }
    for name, recoverer in _RECOVERERS.items():
        result[name] = requeue_missing(recoverer(), dry_run=dry_run, progress=told(name))
    if any(result.values()):
        logger.warning("recovery re-enqueued %s", result, extra={"recovered": result})
    return result
