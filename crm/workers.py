"""Starting workers: one in-process worker, a burst loop that waits for near retries, a pool."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence

from django.conf import settings
from rq.serializers import JSONSerializer

from crm import fairshare, jobs, promote, queues, recovery
from crm.supervisor import Supervisor
from crm.worker import Worker

logger = logging.getLogger(__name__)


def parse_queue_names(value: str | None) -> list[str]:
    if not value:
        return list(queues.QUEUE_NAMES)
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        queues.get_spec(name)  # raises with the list of known queues
    return names


def make_worker(queue_names: Sequence[str]) -> Worker:
    return Worker(
        [jobs.get_queue(n) for n in queue_names], connection=jobs.get_connection(), serializer=JSONSerializer
    )


def _sweep_abandoned(queue_names: Sequence[str], worker: Worker) -> None:
    """Retry (or fail) jobs whose worker is gone: their heartbeat expired, or they were dequeued by
    a worker killed before it registered them as started (RQ's intermediate list; retried once
    they have been seen there for a minute)."""
    for name in queue_names:
        queue = jobs.get_queue(name)
        queue.started_job_registry.cleanup()
        queue.intermediate_queue.cleanup(worker, queue)


def _active(queue_names: Sequence[str]) -> int:
    connection = jobs.get_connection()
    with connection.pipeline(transaction=False) as pipe:
        for name in queue_names:
            pipe.zcard(f"rq:wip:{name}")  # expired entries too: the sweep retries them
            pipe.llen(f"rq:queue:{name}")
            pipe.llen(f"rq:queue:{name}:intermediate")
        listed = sum(pipe.execute())
    # Parked tenants' jobs are not runnable yet: waited for like delayed jobs (`_next_due`).
    parked = fairshare.parked_waiting(connection, queue_names)
    return listed + sum(fairshare.waiting(connection, queue_names).values()) - parked


def _next_due(queue_names: Sequence[str]) -> float | None:
    """Seconds until a delayed job is due or a parked tenant rejoins its queue (None: neither)."""
    waits = [promote.seconds_until_next_due(queue_names)]
    parked = fairshare.next_parked(jobs.get_connection(), queue_names)
    if parked is not None:
        waits.append(max(parked - time.time(), 0.0))
    known = [w for w in waits if w is not None]
    return min(known) if known else None


def run_burst(queue_names: Sequence[str], *, settle: float = 3.0) -> int:
    """Work until every queue is empty, nothing runs elsewhere and nothing is due within `settle` s;
    1 if a worker died of an error (it was logged), else 0."""
    while True:
        promote.promote_due(queue_names)
        worker = make_worker(queue_names)
        worker.work(burst=True, logging_level="WARNING")
        if worker.died_of is not None:
            return 1
        # A job whose worker died is only retried by a registry sweep: do it before deciding
        # that nothing is left (a long-running worker sweeps every CRM_MAINTENANCE_INTERVAL).
        _sweep_abandoned(queue_names, worker)
        promote.promote_due(queue_names)
        wait = _next_due(queue_names)
        if _active(queue_names):
            time.sleep(0.1)
            continue
        if wait is None or wait > settle:
            return 0
        time.sleep(min(wait, 0.5) + 0.01)


def _recover_at_start() -> None:
    """A long-running pool starts with a recovery pass, like the scheduler: work the database knows
    of but Redis lost (a flushed or replaced Redis) is back on the queues before the first job."""
    try:
        recovery.recover()
    except Exception:  # the periodic pass will try again; never keep the workers from starting
        logger.exception("recovery pass at worker start failed")


def run(
    queue_names: Sequence[str], *, burst: bool, processes: int, settle: float, recover: bool = True
) -> int:
    if recover and not burst:
        _recover_at_start()
    if processes <= 1:
        if burst:
            return run_burst(queue_names, settle=settle)
        worker = make_worker(queue_names)
        logger.info("worker %s (pid %s) listening on %s", worker.name, worker.pid, ", ".join(queue_names))
        worker.work(logging_level="WARNING")
        return 0 if worker.died_of is None else 1
    supervisor = Supervisor(exit_when_all_done=burst)
    argv = [
        sys.executable,
        str(settings.BASE_DIR / "manage.py"),
        "workers",
        "--processes",
        "1",
        "--queues",
        ",".join(queue_names),
        "--settle",
        str(settle),
        "--no-recover",  # the pool's parent did it
    ]
    if burst:
        argv.append("--burst")
    for i in range(processes):
        supervisor.add(f"worker.{i + 1}", argv, restart=not burst)
    return supervisor.run()
