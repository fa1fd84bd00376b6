"""Per-queue counts in the seed's shape: {queue: {waiting, active, failed, completed, delayed}}."""

from __future__ import annotations

from datetime import UTC, datetime

from rq.utils import utcparse

from crm import fairshare, jobs, queues

STATES = ("waiting", "active", "failed", "completed", "delayed")


def queue_stats() -> dict[str, dict[str, int]]:
    """One pipelined round trip for every queue; reads raw sizes and never cleans registries."""
    connection = jobs.get_connection()
    with connection.pipeline(transaction=False) as pipe:
        for name in queues.QUEUE_NAMES:
            keys = queues.redis_keys(name)
            pipe.llen(keys["waiting"])
            for state in ("active", "failed", "completed", "scheduled", "deferred"):
                pipe.zcard(keys[state])
            pipe.get(fairshare.count_key(name))
        raw = pipe.execute()
    result = {}
    for i, name in enumerate(queues.QUEUE_NAMES):
        listed, active, failed, completed, scheduled, deferred, fair = raw[i * 7 : (i + 1) * 7]
        waiting = listed + max(int(fair or 0), 0)  # RQ's list and the tenants' lists (crm.fairshare)
        # "delayed" as BullMQ means it: waiting for a time (scheduled/retry backoff) or for a
        # dependency (deferred).
        result[name] = {
            "waiting": waiting,
            "active": active,
            "failed": failed,
            "completed": completed,
            "delayed": scheduled + deferred,
        }
    return result


def tenant_stats(*, top: int = 10) -> dict[str, dict]:
    """Per fair queue: its tenants with work waiting, the `top` by waiting jobs with their share of
    turns, and what the others hold (crm.fairshare.tenant_summary)."""
    connection = jobs.get_connection()
    return {
        name: fairshare.tenant_summary(connection, name, top=top)
        for name in queues.QUEUE_NAMES
        if queues.is_fair(name)
    }


TENANT_HEADS = 200  # tenants per fair queue whose oldest job oldest_waiting looks at (bounded)


def oldest_waiting() -> dict[str, float]:
    """Seconds the oldest job waiting on each non-empty queue has waited: the head of RQ's list
    and, on a fair queue, the heads of its tenants' lists (the first TENANT_HEADS tenants in
    serving order, and as many parked ones); three pipelined round trips. Queues with nothing
    waiting are left out."""
    connection = jobs.get_connection()
    fair = [name for name in queues.QUEUE_NAMES if queues.is_fair(name)]
    with connection.pipeline(transaction=False) as pipe:
        for name in queues.QUEUE_NAMES:
            pipe.lindex(f"rq:queue:{name}", 0)
        for name in fair:
            pipe.zrange(fairshare.ready_key(name), 0, TENANT_HEADS - 1)
            pipe.zrange(fairshare.parked_key(name), 0, TENANT_HEADS - 1)  # parked tenants wait too
        raw = pipe.execute()
    heads, sets = raw[: len(queues.QUEUE_NAMES)], raw[len(queues.QUEUE_NAMES) :]
    present = [(name, _text(h)) for name, h in zip(queues.QUEUE_NAMES, heads, strict=True) if h]
    tenants = [
        (name, _text(t))
        for name, ready, parked in zip(fair, sets[::2], sets[1::2], strict=True)
        for t in [*ready, *parked]
        if _text(t) != fairshare.PLAIN
    ]
    if tenants:
        with connection.pipeline(transaction=False) as pipe:
            for name, tenant in tenants:
                pipe.lindex(fairshare.tenant_key(name, tenant), 0)
            present += [(name, _text(h)) for (name, _), h in zip(tenants, pipe.execute(), strict=True) if h]
    if not present:
        return {}
    with connection.pipeline(transaction=False) as pipe:
        for _, job_id in present:
            pipe.hget(f"rq:job:{job_id}", "enqueued_at")
        stamps = pipe.execute()
    now = datetime.now(UTC)
    oldest: dict[str, float] = {}
    for (name, _), stamp in zip(present, stamps, strict=True):
        if stamp:
            age = max((now - utcparse(_text(stamp))).total_seconds(), 0.0)
            oldest[name] = max(oldest.get(name, 0.0), age)
    return oldest


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
