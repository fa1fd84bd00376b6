"""The cron table: periodic jobs, registered idempotently in rq-scheduler.

Each app lists its entries in `<app>/schedules.py` as `ENTRIES = [CronEntry(...)]`. Cron fields
are read in settings.TIME_ZONE (Django sets the process's TZ to it, and rq-scheduler evaluates
cron strings in local time). rq-scheduler only fires `crm.tasks.cron_fire`, which enqueues the
entry's real job through `crm.jobs.enqueue` with a job id per occurrence, so every periodic job
gets the queue's retry policy, JSON payloads and at most one job per occurrence.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import import_module
from typing import Any

from croniter import croniter
from django.apps import apps
from django.utils import timezone
from rq.job import Job
from rq.serializers import JSONSerializer
from rq_scheduler import Scheduler

from crm import jobs, queues

logger = logging.getLogger(__name__)

# rq-scheduler evaluates cron strings in local time (= TIME_ZONE, which Django sets as the
# process's TZ); that is the behaviour we rely on, so crontab's "will use utcnow" notice is noise.
warnings.filterwarnings("ignore", category=FutureWarning, module="rq_scheduler.utils")

JOB_ID_PREFIX = "cron-"


@dataclass(frozen=True)
class CronEntry:
    name: str
    cron: str
    func: str
    queue: str
    description: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not croniter.is_valid(self.cron):
            raise ValueError(f"cron entry {self.name}: {self.cron!r} is not a valid cron expression")
        queues.get_spec(self.queue)
        jobs.check_payload(self.kwargs)

    @property
    def job_id(self) -> str:
        return JOB_ID_PREFIX + self.name

    def next_runs(self, count: int = 1, *, after: datetime | None = None) -> list[datetime]:
        """The next run times, aware, in settings.TIME_ZONE."""
        base = timezone.localtime(after or timezone.now())
        it = croniter(self.cron, base)
        return [it.get_next(datetime) for _ in range(count)]


def cron_table() -> dict[str, CronEntry]:
    table: dict[str, CronEntry] = {}
    for app in apps.get_app_configs():
        try:
            module = import_module(f"{app.name}.schedules")
        except ModuleNotFoundError as exc:
            if exc.name != f"{app.name}.schedules":
                raise
            continue
        for entry in getattr(module, "ENTRIES", []):
            if entry.name in table:
                raise ValueError(f"cron entry {entry.name!r} is defined twice")
            table[entry.name] = entry
    return table


class JSONJob(Job):
    """rq-scheduler creates jobs without a serializer; ours are JSON everywhere."""

    def __init__(self, id: str | None = None, connection: Any = None, serializer: Any = None) -> None:
        super().__init__(id=id, connection=connection, serializer=serializer or JSONSerializer)


def get_scheduler(interval: int = 5) -> Scheduler:
    return CrmScheduler(
        queue_name=queues.MAINTENANCE, connection=jobs.get_connection(), interval=interval, job_class=JSONJob
    )


def cron_register(
    scheduler: Scheduler | None = None, table: dict[str, CronEntry] | None = None
) -> dict[str, str]:
    """Make rq-scheduler hold exactly the cron table; returns {name: added|updated|kept|removed}.

    Idempotent: an entry already registered with the same expression is kept (its next run
    time untouched); a changed one is replaced; one no longer in the table is removed.
    """
    scheduler = scheduler or get_scheduler()
    table = cron_table() if table is None else table
    result: dict[str, str] = {}
    registered = {job.id: job for job in scheduler.get_jobs() if job.id.startswith(JOB_ID_PREFIX)}
    for entry in table.values():
        existing = registered.pop(entry.job_id, None)
        if (
            existing is not None
            and existing.meta.get("cron_string") == entry.cron
            and existing.kwargs == {"name": entry.name}
        ):
            result[entry.name] = "kept"
            continue
        if existing is not None:
            scheduler.cancel(existing)
        scheduler.cron(
            entry.cron,
            func="crm.tasks.cron_fire",
            kwargs={"name": entry.name},
            id=entry.job_id,
            queue_name=queues.MAINTENANCE,
            description=entry.description or entry.name,
            result_ttl=3600,
            use_local_timezone=True,
        )
        result[entry.name] = "updated" if existing is not None else "added"
    for job in registered.values():
        scheduler.cancel(job)
        job.delete()
        result[job.id.removeprefix(JOB_ID_PREFIX)] = "removed"
    # Entries an older version registered under rq-scheduler's stock key: a stock `rqscheduler`
    # would crash on them.
    scheduler.connection.zrem(Scheduler.scheduled_jobs_key, *[e.job_id for e in table.values()] or ["-"])
    return result


def _local(when: datetime) -> datetime:
    if timezone.is_naive(when):  # rq-scheduler reports naive UTC
        when = when.replace(tzinfo=UTC)
    return timezone.localtime(when)


def cron_schedule() -> list[dict[str, Any]]:
    """Each entry with its next run as registered in the scheduler (None if not registered)."""
    scheduler = get_scheduler()
    times = {job.id: when for job, when in scheduler.get_jobs(with_times=True)}
    rows = []
    for entry in cron_table().values():
        when = times.get(entry.job_id)
        rows.append(
            {
                "name": entry.name,
                "cron": entry.cron,
                "queue": entry.queue,
                "func": entry.func,
                "description": entry.description,
                "next_run": _local(when) if when else None,
            }
        )
    return rows


def cron_fire(name: str, *, manual: bool = False) -> str | None:
    """Enqueue the entry's job for the current occurrence (at most once per minute, or now)."""
    entry = cron_table().get(name)
    if entry is None:
        logger.warning("cron entry %s is no longer in the table; ignored", name)
        return None
    stamp = timezone.localtime().strftime("%Y%m%d%H%M%S" if manual else "%Y%m%d%H%M")
    return jobs.enqueue(
        entry.func,
        queue=entry.queue,
        kwargs=entry.kwargs,
        unique=True,
        job_id=jobs.make_job_id(entry.name, "manual" if manual else "cron", stamp),
        description=f"{entry.name} ({'run now' if manual else 'cron'})",
    )


class CrmScheduler(Scheduler):
    """rq-scheduler that re-registers the cron table every minute, so a Redis flush loses no entry.

    Its keys are its own: a stock `rqscheduler` (which reads RQ's pickle format) started against
    the product's Redis finds none of the product's JSON entries, instead of crashing at the first
    one due, and is never counted as the product's scheduler by /healthz."""

    redis_scheduler_namespace_prefix = "crm:scheduler_instance:"
    scheduler_key = "crm:scheduler"
    scheduler_lock_key = "crm:scheduler_lock"
    scheduled_jobs_key = "crm:scheduler:scheduled_jobs"
    reregister_every = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._registered_at = 0.0

    def heartbeat(self) -> None:
        # EXPIRE on a key Redis lost (a restart without persistence, a flush) does nothing and says
        # so: register again, so /healthz counts this scheduler (the cron table comes back below).
        if not self.connection.expire(self.key, int(self._interval) + 10):
            self.register_birth()
            self._registered_at = 0.0  # and the cron table, at once
            logger.warning("scheduler %s registered again: Redis had lost its registration", self.key)

    def enqueue_jobs(self) -> list:

        if time.monotonic() - self._registered_at > self.reregister_every:
            changes = {k: v for k, v in cron_register(self).items() if v != "kept"}
            if changes:
                logger.info("cron table registered: %s", changes)
            self._registered_at = time.monotonic()
        return super().enqueue_jobs()
