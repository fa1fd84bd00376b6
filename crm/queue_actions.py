"""The operators' actions on queued jobs, one job or in bulk: retry, delete, promote, cancel, empty.

Every action claims its jobs atomically first (ZREM from a registry, LREM/LPOP from a queue) and
acts only on what it claimed, so a job a worker or another operator moved meanwhile is left alone;
bulk actions claim and act in batches of BULK, so memory stays bounded whatever a queue holds."""

from __future__ import annotations

from redis import Redis
from rq.job import Job, JobStatus
from rq.results import Result
from rq.serializers import JSONSerializer

from crm import fairshare, jobs, promote, queues
from crm.queue_ops import _JOB, BULK, BULK_ACTIONS, JobGone, WrongState, _sizes, _status, _text, is_queue

# Pop up to ARGV[1] waiting ids and delete their hashes, atomically per batch.
_EMPTY = """
local ids = redis.call('LPOP', KEYS[1], tonumber(ARGV[1]))
if not ids then return 0 end
for _, id in ipairs(ids) do
  redis.call('DEL', ARGV[2] .. id, ARGV[2] .. id .. ':dependents', ARGV[2] .. id .. ':dependencies',
             'rq:results:' .. id)
end
return #ids
"""


def _fetch(job_id: str) -> Job:
    job = jobs.fetch_job(job_id)
    if job is None:
        raise JobGone(job_id)
    return job


def _claim(connection: Redis, key: str, job_ids: list[str]) -> list[str]:
    """ZREM each id from a registry; the ids this call removed are ours to act on."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.zrem(key, job_id)
        removed = pipe.execute()
    return [job_id for job_id, r in zip(job_ids, removed, strict=True) if r]


def _requeue_failed(connection: Redis, queue: str, job_ids: list[str]) -> int:
    """Failed jobs back on their queue with the queue's attempts; returns how many.

    RQ's FailedJobRegistry.requeue, in bulk, plus what it leaves out: the attempts are reset to
    the queue's policy, and the hash loses the failure TTL it was given (a retried job waiting
    longer than that would vanish from its queue)."""
    claimed = _claim(connection, queues.redis_keys(queue)["failed"], job_ids)
    if not claimed:
        return 0
    spec = queues.get_spec(queue)
    rq_queue = jobs.get_queue(queue)
    found = [j for j in Job.fetch_many(claimed, connection=connection, serializer=JSONSerializer) if j]
    with connection.pipeline() as pipe:
        for job in found:
            job.retries_left = max(spec.attempts - 1, 0)
            if spec.attempts > 1:
                job.retry_intervals = spec.retry_intervals()
            job.started_at = None
            job.ended_at = None
            rq_queue._enqueue_job(job, pipeline=pipe)
            pipe.persist(job.key)
        pipe.execute()
    return len(found)


def job_retry(job_id: str) -> tuple[str, int]:
    """A failed job back on its queue; returns (queue, attempts it now has)."""
    job = _fetch(job_id)
    status = _status(job)
    if not is_queue(job.origin):
        raise WrongState(status)
    if not _requeue_failed(jobs.get_connection(), job.origin, [job.id]):
        raise WrongState(status)
    return job.origin, queues.get_spec(job.origin).attempts


def job_delete(job_id: str) -> str:
    """Remove a job from its queue and every registry and delete it; returns its queue.

    A job a worker is running is refused (WrongState): deleting it would not stop it, and the worker
    would write it back when it ends. Once it ends, or its dead worker's job is swept back onto
    its queue (within about 15 s), it can be deleted."""
    job = _fetch(job_id)
    if job.get_status(refresh=False) == JobStatus.STARTED:
        raise WrongState(_status(job))
    if not jobs.delete_job(job.id):
        raise JobGone(job.id)
    return job.origin


def job_promote(job_id: str) -> str:
    """A scheduled (delayed) job onto its queue now; returns the queue."""
    job = _fetch(job_id)
    if not is_queue(job.origin) or not promote.promote_now(job.origin, [job.id]):
        raise WrongState(_status(job))
    return job.origin


def job_cancel(job_id: str) -> str:
    """A waiting job off its queue, canceled (kept for the queue's result TTL); returns the queue."""
    job = _fetch(job_id)
    status = job.get_status(refresh=False)
    if not is_queue(job.origin) or status != JobStatus.QUEUED:
        raise WrongState(_status(job))
    connection = jobs.get_connection()
    waiting = queues.redis_keys(job.origin)["waiting"]
    if not connection.lrem(waiting, 1, job.id) and not fairshare.remove(connection, job.origin, job):
        raise WrongState(_status(job, refresh=True))  # a worker took it meanwhile
    job.cancel()
    ttl = queues.get_spec(job.origin).result_ttl
    if ttl > 0:  # RQ keeps a canceled job forever; like a finished one it goes after the result TTL
        connection.expire(job.key, ttl)
    return job.origin


# --- bulk -------------------------------------------------------------------------------------
def state_sizes(queue: str) -> dict[str, int]:
    """{waiting, active, failed, completed, delayed, and delayed's parts: scheduled, deferred}."""
    return _sizes(jobs.get_connection(), queue)


def bulk_count(queue: str, action: str) -> int:
    """How many jobs `action` would act on now (promote-all: the scheduled ones only)."""
    sizes = _sizes(jobs.get_connection(), queue)
    state = BULK_ACTIONS[action]
    return sizes["scheduled"] if action == "promote-all" else sizes[state]


def bulk_run(queue: str, action: str, *, limit: int | None = None) -> int:
    """Run a bulk action, oldest first, on at most `limit` jobs (and never more than are there now),
    BULK per batch; returns how many it moved."""
    if not is_queue(queue) or action not in BULK_ACTIONS:
        raise ValueError(f"unknown queue or bulk action: {queue!r}, {action!r}")
    connection = jobs.get_connection()
    keys = queues.redis_keys(queue)
    if action == "empty":
        return _empty(connection, queue, limit)
    key = keys["scheduled"] if action == "promote-all" else keys["failed"]
    limit, seen, done = _bound(connection.zcard(key), limit), 0, 0
    while seen < limit:
        ids = [_text(i) for i in connection.zrange(key, 0, min(BULK, limit - seen) - 1)]
        if not ids:
            break
        seen += len(ids)
        if action == "promote-all":
            done += promote.promote_now(queue, ids)
        elif action == "retry-all":
            done += _requeue_failed(connection, queue, ids)
        else:
            done += _delete_failed(connection, queue, ids)
    return done


def _delete_failed(connection: Redis, queue: str, job_ids: list[str]) -> int:
    claimed = _claim(connection, queues.redis_keys(queue)["failed"], job_ids)
    with connection.pipeline(transaction=False) as pipe:
        for job_id in claimed:
            key = _JOB + job_id
            pipe.delete(key, f"{key}:dependents", f"{key}:dependencies", Result.get_key(job_id))
        pipe.execute()
    return len(claimed)


def _bound(size: int, limit: int | None) -> int:
    return size if limit is None else min(size, max(limit, 0))


def _empty(connection: Redis, queue: str, limit: int | None) -> int:
    key = queues.redis_keys(queue)["waiting"]
    script = connection.register_script(_EMPTY)
    limit, done = _bound(_sizes(connection, queue)["waiting"], limit), 0
    while done < limit:
        popped = int(script(keys=[key], args=[min(BULK, limit - done), _JOB]))
        if not popped:
            break
        done += popped
    return done + fairshare.drain(connection, queue, limit - done, batch=BULK)
