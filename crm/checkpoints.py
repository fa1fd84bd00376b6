"""JobRun checkpoints: record a piece of work before its side effects, mark how it ended.

    with checkpoint(kind="erp-sync", key="store-7:2026-11-28", func=..., queue=..., kwargs=...) as run:
        ...side effects...

The row is written (status running) before the block runs, so a crash leaves it `running` and
`recover` finds it. A completed checkpoint is not run again: `checkpoint` raises AlreadyDone.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone
from rq import get_current_job

from crm.jobs import Defer, check_payload, enqueue, func_path, make_job_id
from crm.models import JobRun


class AlreadyDone(Exception):
    """The checkpoint was completed before; running it again would repeat its side effects."""


def jobrun_start(
    *,
    kind: str,
    key: str,
    func: str | Callable[..., Any] = "",
    queue: str = "",
    kwargs: dict[str, Any] | None = None,
    job_id: str = "",
    organization_id: int | None = None,
) -> JobRun:
    """Create or resume the JobRun (kind, key) as running, attempts+1. Raises AlreadyDone."""
    kwargs = kwargs or {}
    check_payload(kwargs)
    with transaction.atomic():
        run, created = JobRun.objects.select_for_update().get_or_create(
            kind=kind,
            key=key,
            defaults={
                "func": func_path(func) if func else "",
                "queue": queue,
                "kwargs": kwargs,
                "job_id": job_id,
                "organization_id": organization_id,
                "attempts": 1,
            },
        )
        if created:
            return run
        if run.status == JobRun.Status.COMPLETED:
            raise AlreadyDone(f"{kind}:{key} completed at {run.finished_at}")
        run.status = JobRun.Status.RUNNING
        run.attempts = F("attempts") + 1
        run.started_at = timezone.now()
        run.finished_at = None
        run.error = ""
        if job_id:
            run.job_id = job_id
        run.save(update_fields=["status", "attempts", "started_at", "finished_at", "error", "job_id"])
        run.refresh_from_db(fields=["attempts"])
        return run


def jobrun_finish(run: JobRun, *, error: str = "") -> None:
    run.status = JobRun.Status.FAILED if error else JobRun.Status.COMPLETED
    run.finished_at = timezone.now()
    run.error = error[-10_000:]
    run.save(update_fields=["status", "finished_at", "error"])


@contextmanager
def checkpoint(**start_kwargs: Any) -> Iterator[JobRun]:
    """Wrap work in a JobRun: running before, completed after, failed (with traceback) on error."""
    if "job_id" not in start_kwargs:
        job = get_current_job()
        start_kwargs["job_id"] = job.id if job else ""
    run = jobrun_start(**start_kwargs)
    try:
        yield run
    except BaseException as exc:
        if isinstance(exc, Defer):
            raise  # not a failure: the job runs again later and resumes this run
        jobrun_finish(run, error="".join(traceback.format_exception(exc)))
        raise
    jobrun_finish(run)


def error_reason(error: str) -> str:
    """A JobRun's error without its traceback: the exception's last line ("ValueError: …"), which
    names no server path or source line (the full text is for platform operators)."""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:500] if lines else ""


def jobrun_job_id(kind: str, key: str) -> str:

    return make_job_id("jobrun", kind, key)


def jobrun_enqueue(
    *,
    kind: str,
    key: str,
    func: str | Callable[..., Any],
    queue: str,
    kwargs: dict[str, Any] | None = None,
    organization_id: int | None = None,
    delay: float | None = None,
) -> JobRun:
    """Record a durable run in the database and enqueue its job after commit.

    The row exists before the job does, so if Redis loses the job `recover` re-enqueues it.
    Safe to call twice: an unfinished run is not enqueued again while its job exists, and a
    completed run is left alone.
    """

    kwargs = kwargs or {}
    check_payload(kwargs)
    job_id = jobrun_job_id(kind, key)
    run, _created = JobRun.objects.get_or_create(
        kind=kind,
        key=key,
        defaults={
            "func": func_path(func),
            "queue": queue,
            "kwargs": kwargs,
            "job_id": job_id,
            "organization_id": organization_id,
        },
    )
    if run.status != JobRun.Status.COMPLETED:
        enqueue(
            func,
            queue=queue,
            kwargs=kwargs,
            job_id=job_id,
            unique=True,
            delay=delay,
            organization_id=organization_id,
        )
    return run
