"""Queues no worker listens to any more (crm.queues.RETIRED): the jobs an upgrade finds on them are
moved onto the queue that does their work now, so none is lost with its queue.

The recovery pass (`recover`, also at every worker pool's start) moves them: each job waiting,
delayed or abandoned by a killed worker on a retired queue is enqueued again, the same function
with the same arguments (the jobs are idempotent), on its new queue, and deleted from the old one.
A job an old worker is still running is left to finish there."""

from __future__ import annotations

import logging
import time

from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from crm import jobs, queues

logger = logging.getLogger(__name__)


def _stranded(queue: str) -> list[str]:
    """The ids of the jobs on `queue` that no worker will run: waiting, delayed, or started by a
    worker whose heartbeat expired (RQ keeps 'id:execution' members in that registry)."""
    keys = queues.redis_keys(queue)
    connection = jobs.get_connection()
    with connection.pipeline(transaction=False) as pipe:
        pipe.lrange(keys["waiting"], 0, -1)
        pipe.zrange(keys["scheduled"], 0, -1)
        pipe.zrange(keys["deferred"], 0, -1)
        pipe.zrangebyscore(keys["active"], 0, time.time())
        waiting, scheduled, deferred, abandoned = pipe.execute()
    ids = [i.decode() for i in (*waiting, *scheduled, *deferred)]
    ids += [i.decode().split(":", 1)[0] for i in abandoned]
    return list(dict.fromkeys(ids))


def move_retired() -> dict[str, int]:
    """Move the stranded jobs of every retired queue onto its successor; returns {queue: moved}."""
    moved: dict[str, int] = {}
    connection = jobs.get_connection()
    for old, new in queues.RETIRED.items():
        keys = queues.redis_keys(old)
        count = 0
        for job_id in _stranded(old):
            try:
                job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
                func, kwargs, meta = job.func_name, dict(job.kwargs or {}), dict(job.meta or {})
            except (NoSuchJobError, DeserializationError):
                func = ""
            if func:
                jobs.enqueue(
                    func,
                    queue=new,
                    kwargs=kwargs,
                    organization_id=meta.get("organization_id"),
                    description=f"moved from the retired {old} queue",
                    after_commit=False,
                )
                count += 1
            with connection.pipeline(transaction=False) as pipe:
                pipe.lrem(keys["waiting"], 0, job_id)
                for registry in ("scheduled", "deferred"):
                    pipe.zrem(keys[registry], job_id)
                pipe.execute()
            jobs.delete_job(job_id)
        connection.zremrangebyscore(keys["active"], 0, time.time())
        if count:
            logger.warning("moved %s job(s) from the retired queue %s to %s", count, old, new)
        moved[old] = count
    return moved
