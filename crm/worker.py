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

A job the worker cannot read (written with RQ's default pickle serializer by `rq enqueue` or a
plain `Queue.enqueue`, or a hash something else wrote) is failed with the reason, never
retried, and the worker goes on. A worker that does die of an error (RQ's loop logs "found an
unhandled exception, quitting" and returns normally) keeps the error in `died_of`, so its command
exits non-zero and a supervisor restarts it.
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
from rq.defaults import DEFAULT_FAILURE_TTL
from rq.exceptions import DeserializationError, StopRequested
from rq.group import Group
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import SimpleWorker, WorkerStatus

from crm import prometheus, promote
from crm.fairshare import FairQueue
from crm.jobs import Defer, Park, Yield

logger = logging.getLogger("crm.jobs")

PUBSUB_WAKE = 1.0  # seconds: the most a warm stop waits for the command listener to notice it

UNREADABLE = (
    "job {job_id} cannot be read by the product's workers (they read RQ's JSON serializer; was it "
    "enqueued with RQ's default pickle serializer, e.g. `rq enqueue` without `--serializer "
    "rq.serializers.JSONSerializer`?): failed, not run. {error}"
)


class UnreadableJob(Exception):
    """A job whose data the worker cannot deserialize: it fails without running, and is not retried."""


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
        # The product's queues hold JSON: a serializer asked for elsewhere (django-rq's `rqworker`
        # passes RQ's pickle one unless told otherwise) would fail every job it dequeues.
        asked = kwargs.pop("serializer", None)
        if asked not in (None, JSONSerializer, "rq.serializers.JSONSerializer", "json"):
            logger.warning(
                "serializer %s ignored: the product's jobs are JSON", getattr(asked, "__name__", asked)
            )
        kwargs["serializer"] = JSONSerializer
        kwargs.setdefault("worker_ttl", settings.CRM_WORKER_TTL)
        kwargs.setdefault("maintenance_interval", settings.CRM_MAINTENANCE_INTERVAL)
        kwargs.setdefault("job_monitoring_interval", settings.CRM_HEARTBEAT_INTERVAL)
        super().__init__(*args, **kwargs)
        self._beat_lock = threading.Lock()
        self._beating = False
        self._deferred = False
        self._promoted_at = 0.0
        self.died_of: BaseException | None = None

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        self._burst = burst
        return super().work(burst, *args, **kwargs)

    # --- dying loudly: RQ's loop swallows the error that ends it; keep it for the exit status ----
    def _noting_death(self, step: Any, *args: Any) -> Any:
        try:
            return step(*args)
        except (StopRequested, SystemExit):
            raise
        except BaseException as exc:
            self.died_of = exc
            raise

    def check_for_suspension(self, burst: bool) -> None:
        self._noting_death(super().check_for_suspension, burst)

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        while True:
            try:
                return self._noting_death(super().dequeue_job_and_maintain_ttl, timeout, max_idle_time)
            except Exception as exc:
                job_id, queue = getattr(exc, "job_id", None), getattr(exc, "queue", None)
                if job_id is None or queue is None:
                    raise
                # RQ could not load the job it dequeued (a hash it cannot restore): fail that job.
                self.died_of = None
                self._noting_death(self._fail_unfetchable, str(job_id), queue, exc)

    # --- a warm stop that holds: RQ raises StopRequested from the signal handler, wherever the
    # main thread is when idle; an `except Exception` on the way (RQ's registry sweep, a logging
    # handler) swallows it, and the idle loop, which never asks again, waits for a second signal.
    def _shutdown(self) -> None:
        self._stop_requested = True
        super()._shutdown()

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        # Called between jobs and on every idle second (never from the job's heartbeat thread,
        # which passes a pipeline): the place a remembered stop is acted on.
        if self._stop_requested and pipeline is None and self.get_state() != WorkerStatus.BUSY:
            raise StopRequested
        super().heartbeat(timeout, pipeline=pipeline)

    def subscribe(self) -> None:
        """Listen on the command channel (stop a job, shut down), as RQ does, but with the listener
        waking every PUBSUB_WAKE seconds instead of 60: at a warm stop RQ unsubscribes, then stops
        and joins the listener, and when the listener has read the unsubscribe answer before it is
        told to stop it waits out its whole sleep for a message that never comes (a SIGTERM'd
        worker, its work done, took 60 s to exit; `manage.py up` kills it after 20). A burst worker
        does not listen: it would only pay for stopping the listener."""
        if getattr(self, "_burst", False):
            return
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # RQ declares it None
            sleep_time=PUBSUB_WAKE, daemon=True, exception_handler=self._pubsub_exception_handler
        )

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
        try:
            job.func_name  # noqa: B018 -- reads the job's data: raises if it cannot be deserialized
        except DeserializationError as exc:
            self._fail_unreadable(job, queue, exc)
            return
        self._noting_death(self._execute_job, job, queue)

    def _execute_job(self, job: Job, queue: Queue) -> None:
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

    # --- jobs the worker cannot read -----------------------------------------------------------
    def _fail_unreadable(self, job: Job, queue: Queue, exc: Exception) -> None:
        """Fail a job whose data cannot be deserialized, with the reason, without running or retrying it."""
        cause = exc.__cause__ or exc
        reason = UNREADABLE.format(job_id=job.id, error=f"{type(cause).__name__}: {cause}"[:300])
        logger.error(reason, extra={"queue": queue.name, "job_id": job.id, "outcome": "failed"})
        job.meta = {}  # a pickled meta cannot be written back with the JSON serializer
        job.retries_left = 0
        self.prepare_execution(job)
        try:
            raise UnreadableJob(reason)
        except UnreadableJob:
            self.handle_job_failure(job, queue, exc_string=reason)
        self._idle_and_count(queue, "failed", 0.0)

    def _fail_unfetchable(self, job_id: str, queue: Queue, exc: Exception) -> None:
        """Fail a job RQ could not even load: its hash is marked failed with the reason, and it joins
        the queue's failed registry (for the queue pages and `rq info`)."""
        reason = UNREADABLE.format(job_id=job_id, error=f"{type(exc).__name__}: {exc}"[:300])
        logger.error(reason, extra={"queue": queue.name, "job_id": job_id, "outcome": "failed"})
        registry = queue.failed_job_registry
        with self.connection.pipeline() as pipeline:
            pipeline.hset(Job.key_for(job_id), mapping={"status": JobStatus.FAILED.value, "exc_info": reason})
            pipeline.zadd(registry.key, {job_id: time.time() + DEFAULT_FAILURE_TTL})
            # Out of RQ's intermediate list too: its sweep would load the hash, and fail as we did.
            pipeline.lrem(queue.intermediate_queue_key, 0, job_id)
            pipeline.execute()

    # --- "delay, don't fail" ---------------------------------------------------------------
    def handle_job_failure(
        self, job: Job, queue: Queue, started_job_registry: Any = None, exc_string: str = ""
    ) -> None:
        exc = sys.exc_info()[1]  # called from inside perform_job's except block
        if isinstance(exc, Yield) and self._stopped_job_id != job.id:
            # Back at the head of its tenant's list now (no scheduled registry, no promotion
            # delay): the tenants after it in turn run first, then it resumes.
            with self.connection.pipeline() as pipeline:
                self.cleanup_execution(job, pipeline=pipeline)
                job.meta["yields"] = int(job.meta.get("yields", 0)) + 1
                assert isinstance(queue, FairQueue)
                queue.push_yielded(job, pipeline)
                pipeline.execute()
            job._status = JobStatus.QUEUED
            return
        if (
            isinstance(exc, Park)
            and isinstance(queue, FairQueue)
            and queue.parks(job)
            and self._stopped_job_id != job.id
        ):
            # Its tenant out of turn until its limit has room again (no pick wasted on it).
            with self.connection.pipeline() as pipeline:
                self.cleanup_execution(job, pipeline=pipeline)
                job.meta["deferrals"] = int(job.meta.get("deferrals", 0)) + 1
                job.meta["deferred_reason"] = exc.reason
                queue.park_job(job, pipeline, seconds=exc.seconds)
                pipeline.execute()
            job._status = JobStatus.QUEUED
            self._deferred = True
            return
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
            # A success whose result is not kept (result_ttl 0: RQ never marks it finished).
            JobStatus.STARTED: "succeeded",
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
