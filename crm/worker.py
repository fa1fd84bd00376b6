"""The project's RQ worker: no fork per job, fast detection of a killed worker, one log line per job.

RQ's default worker forks a work horse for every job (~100 no-op jobs/s on 2 cores); this one
runs jobs in its own process (SimpleWorker), which is several times faster. Isolation between
jobs comes from running many worker processes (`manage.py workers --processes N`).

Delayed jobs (enqueue_in, retry backoff, Defer) are promoted by every worker about once a
second (crm.promote), instead of by RQ's scheduler process, whose lock outlives a killed holder
by a minute.

A background thread refreshes the running job's heartbeat every CRM_HEARTBEAT_INTERVAL seconds
with a TTL of CRM_HEARTBEAT_TTL; if the process dies (SIGKILL, OOM, lost machine) the entry in
the started registry expires and the next registry sweep by any live worker (every
CRM_MAINTENANCE_INTERVAL seconds) retries the job or moves it to failed. RQ's defaults take
minutes (the job timeout plus 60 s, swept every 10 minutes).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import close_old_connections, connection
from rq import Queue, worker_registration
from rq.group import Group
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import SimpleWorker, WorkerStatus

from crm import prometheus, promote
from crm.fairshare import FairQueue
from crm.jobs import Defer

logger = logging.getLogger("crm.jobs")


class _QueryCounter:
    """Counts SQL statements (CRM_COUNT_QUERIES=1, for benchmarks): queries per job add up in Redis."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.count += 1
        return execute(sql, params, many, context)


class Worker(SimpleWorker):
    queue_class = FairQueue  # its dequeue_any serves tenants in turn (crm.fairshare)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("serializer", JSONSerializer)
        kwargs.setdefault("worker_ttl", settings.CRM_WORKER_TTL)
        kwargs.setdefault("maintenance_interval", settings.CRM_MAINTENANCE_INTERVAL)
        kwargs.setdefault("job_monitoring_interval", settings.CRM_HEARTBEAT_INTERVAL)
        super().__init__(*args, **kwargs)
        self._beat_lock = threading.Lock()
        self._beating = False
        self._deferred = False
        self._promoted_at = 0.0

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        self._burst = burst
        return super().work(burst, *args, **kwargs)

    def subscribe(self) -> None:
        # The command channel (stop a job, shut down) matters for long-lived workers; a burst
        # worker would only pay the ~1 s it takes to stop the listener thread.
        if not getattr(self, "_burst", False):
            super().subscribe()

    # --- the idle loop: promote due delayed jobs every second, sweep registries every few -----
    @property
    def dequeue_timeout(self) -> int:
        return 1

    @property
    def should_run_maintenance_tasks(self) -> bool:
        # Asked before every dequeue (and once per idle second): promote at most once a second.
        return time.monotonic() - self._promoted_at >= 1.0

    def run_maintenance_tasks(self) -> None:
        self._promoted_at = time.monotonic()
        promote.promote_due(self.queue_names())
        due = self.last_cleaned_at is None or (
            now() - self.last_cleaned_at > timedelta(seconds=self.maintenance_interval)
        )
        if due:
            self._register_again_if_lost()
            self.clean_registries()
            Group.clean_registries(connection=self.connection)

    def _register_again_if_lost(self) -> None:
        """Register again when Redis lost this worker's registration (a restart without persistence,
        a flush): the heartbeat alone would not bring back the workers' set that /healthz reads."""
        if self.connection.sismember(worker_registration.REDIS_WORKER_KEYS, self.key):
            return
        with self.connection.pipeline() as pipeline:
            pipeline.hset(self.key, mapping=self.serialize())
            worker_registration.register(self, pipeline)
            pipeline.expire(self.key, self.worker_ttl + 60)
            pipeline.execute()
        logger.warning("worker %s registered again: Redis had lost its registration", self.name)

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        # Every pick goes through the intermediate list (crm.fairshare), whatever the number of
        # queues: leave it in the same transaction that registers the job as started.
        super().prepare_job_execution(job, remove_from_intermediate_queue=True)

    # --- heartbeat -------------------------------------------------------------------------
    def get_heartbeat_ttl(self, job: Job) -> int:
        return settings.CRM_HEARTBEAT_TTL

    def execute_job(self, job: Job, queue: Queue) -> None:
        self.prepare_execution(job)
        self._deferred = False
        stop = threading.Event()
        with self._beat_lock:
            self._beating = True
        beat = threading.Thread(target=self._beat, args=(job, stop), name="rq-heartbeat", daemon=True)
        beat.start()
        started = time.monotonic()
        queries = _QueryCounter()
        try:
            self._close_old_connections()
            if settings.CRM_COUNT_QUERIES:
                with connection.execute_wrapper(queries):
                    self.perform_job(job, queue)
                self.connection.incrby("crm:stats:db_queries", queries.count)
            else:
                self.perform_job(job, queue)
        finally:
            stop.set()
            with self._beat_lock:
                self._beating = False
            beat.join(timeout=5)
            self._close_old_connections()
        duration = time.monotonic() - started
        outcome = self._log_outcome(job, queue, duration)
        self._idle_and_count(queue, outcome, duration)

    @staticmethod
    def _close_old_connections() -> None:
        # As Django does around a request: drop broken or expired connections between jobs.
        # Inside an atomic block (a test running jobs in-process) there is nothing to drop.
        if not connection.in_atomic_block:
            close_old_connections()

    def _beat(self, job: Job, stop: threading.Event) -> None:
        while not stop.wait(self.job_monitoring_interval):
            with self._beat_lock:
                if not self._beating:
                    return
                try:
                    self.maintain_heartbeats(job)
                except redis.RedisError as exc:
                    self.log.warning("heartbeat for job %s failed: %s", job.id, exc)

    def cleanup_execution(self, job: Job, pipeline: Any) -> None:
        # Stop the heartbeat before the execution is removed, so a late beat cannot revive it.
        with self._beat_lock:
            self._beating = False
        super().cleanup_execution(job, pipeline)

    # --- "delay, don't fail" ---------------------------------------------------------------
    def handle_job_failure(
        self, job: Job, queue: Queue, started_job_registry: Any = None, exc_string: str = ""
    ) -> None:
        exc = sys.exc_info()[1]  # called from inside perform_job's except block
        if isinstance(exc, Defer) and self._stopped_job_id != job.id:
            when = now() + timedelta(seconds=exc.seconds)
            with self.connection.pipeline() as pipeline:
                self.cleanup_execution(job, pipeline=pipeline)
                job.meta["deferrals"] = int(job.meta.get("deferrals", 0)) + 1
                job.meta["deferred_reason"] = exc.reason
                job.set_status(JobStatus.SCHEDULED, pipeline=pipeline)
                pipeline.hset(job.key, "meta", job.serializer.dumps(job.meta))
                job.enqueue_at_front = exc.at_front  # where crm.promote enqueues it when due
                queue.schedule_job(job, when, pipeline=pipeline)
                pipeline.execute()
            job._status = JobStatus.SCHEDULED
            self._deferred = True
            return
        super().handle_job_failure(
            job, queue, started_job_registry=started_job_registry, exc_string=exc_string
        )

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        if isinstance(exc_info[1], Defer):
            return
        super().handle_exception(job, *exc_info)

    # --- logging and counting ----------------------------------------------------------------
    def _idle_and_count(self, queue: Queue, outcome: str, duration: float) -> None:
        """Back to idle, and the outcome counted for /metrics, in the one round trip going idle
        already costs. A failed metrics write is dropped: it never touches the job."""
        with self.connection.pipeline(transaction=False) as pipeline:
            prometheus.record_job(pipeline, queue=queue.name, outcome=outcome, duration=duration)
            self.set_state(WorkerStatus.IDLE, pipeline=pipeline)
            replies = pipeline.execute(raise_on_error=False)
        if isinstance(replies[-1], Exception):
            raise replies[-1]  # the worker's own state, as when it was written alone
        errors = [r for r in replies[:-1] if isinstance(r, Exception)]
        if errors:
            logger.debug("job metrics not recorded for queue %s: %s", queue.name, errors[0])

    def _log_outcome(self, job: Job, queue: Queue, duration: float) -> str:
        """One line per outcome; returns the outcome (succeeded, failed, retry-scheduled, deferred…)."""
        status = job.get_status(refresh=False)
        kwargs = job.kwargs if isinstance(job.kwargs, dict) else {}
        # Producers put the tenant in the job's meta; older jobs and the runner's carry it in kwargs.
        organization_id = job.meta.get("organization_id", kwargs.get("organization_id"))
        outcome = {
            JobStatus.FINISHED: "succeeded",
            JobStatus.SCHEDULED: "retry-scheduled",
            JobStatus.QUEUED: "requeued",
            JobStatus.FAILED: "failed",
        }.get(status, str(status))
        if self._deferred:
            outcome = "deferred"
        level = logging.WARNING if status == JobStatus.FAILED else logging.INFO
        logger.log(
            level,
            "job %s queue=%s id=%s org=%s duration=%.3fs",
            outcome,
            queue.name,
            job.id,
            "-" if organization_id is None else organization_id,
            duration,
            extra={
                "queue": queue.name,
                "job_id": job.id,
                "func": job.func_name,
                "outcome": outcome,
                "organization_id": organization_id,
                "duration": round(duration, 4),
            },
        )
        return outcome
