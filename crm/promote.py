"""Moving due delayed jobs (enqueue_at/enqueue_in, retry backoff, deferrals) onto their queues.

RQ's own scheduler runs in one worker at a time behind a lock that outlives a killed holder by
a minute; here every worker promotes due jobs about once a second and claims each one with an
atomic ZREM, so no lock is needed, no job is pushed twice, and a dead worker delays nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rq.job import Job
from rq.serializers import JSONSerializer

from crm import jobs

BATCH = 500

# Claim up to ARGV[2] due ids: only ids this call removed from the set are returned.
_CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], 0, ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local claimed = {}
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then table.insert(claimed, id) end
end
return claimed
"""


def promote_due(queue_names: Sequence[str]) -> int:
    """Enqueue every delayed job that is due on these queues; returns how many."""
    connection = jobs.get_connection()
    claim = connection.register_script(_CLAIM)
    moved = 0
    for name in queue_names:
        key = f"rq:scheduled:{name}"
        while True:
            ids = [
                i.decode() if isinstance(i, bytes) else i
                for i in claim(keys=[key], args=[time.time(), BATCH])
            ]
            if not ids:
                break
            queue = jobs.get_queue(name)
            found = [j for j in Job.fetch_many(ids, connection=connection, serializer=JSONSerializer) if j]
            with connection.pipeline() as pipe:
                for job in found:
                    queue._enqueue_job(job, pipeline=pipe, at_front=bool(job.enqueue_at_front))
                pipe.execute()
            moved += len(found)
            if len(ids) < BATCH:
                break
    return moved


def seconds_until_next_due(queue_names: Sequence[str]) -> float | None:
    connection = jobs.get_connection()
    with connection.pipeline(transaction=False) as pipe:
        for name in queue_names:
            pipe.zrange(f"rq:scheduled:{name}", 0, 0, withscores=True)
        firsts = [r[0][1] for r in pipe.execute() if r]
    return max(min(firsts) - time.time(), 0.0) if firsts else None


def promote_now(queue_name: str, job_ids: Sequence[str]) -> int:
    """Run delayed jobs now instead of at their time (an operator resumed what they waited for)."""
    connection = jobs.get_connection()
    key = f"rq:scheduled:{queue_name}"
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.zrem(key, job_id)
        claimed = [jid for jid, removed in zip(job_ids, pipe.execute(), strict=True) if removed]
    if not claimed:
        return 0
    queue = jobs.get_queue(queue_name)
    found = [j for j in Job.fetch_many(claimed, connection=connection, serializer=JSONSerializer) if j]
    with connection.pipeline() as pipe:
        for job in found:
            queue._enqueue_job(job, pipeline=pipe)
        pipe.execute()
    return len(found)
