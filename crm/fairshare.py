"""Fair share per tenant on RQ: within a queue, tenants with work waiting are served in turn.

A job enqueued with an organization (job.meta["organization_id"]) does not go on RQ's list of its
queue but on that tenant's own list (`crm:fair:<queue>:t:<org>`), and the tenant joins the queue's
ready set (`crm:fair:<queue>:ready`, a sorted set scored by virtual time). A worker takes its next
job with one Lua script (`fairshare_scripts.PICK`): for each of its queues in priority order, the
ready tenant with the lowest virtual time gives its head, which moves in the same script into RQ's
intermediate list (RQ's "dequeued, not yet started" state), and the tenant's time advances by
1/weight (stride scheduling; weight per organization in `crm:fair:weights`, default 1). A tenant
that joins the ready set starts BURST turns before the queue's current time, so it is served at once
whatever the others' backlogs, and a small batch finishes in about its time alone. Jobs without a
tenant (RQ's own list) take part as one more tenant, `_`. Priorities keep their meaning: a queue is
served only when every queue before it in the worker's order is empty, across tenants too. A pick
costs O(queues + log tenants).

Nothing is lost or run twice when a worker dies between its pick and the job's start: the job is
in the intermediate list; `FairIntermediateQueue.cleanup` (the registry sweep) puts a job still
queued back at the head of its tenant after a minute, without spending an attempt. After a Redis
flush the structure is gone with the jobs, and `manage.py recover` enqueues them again from
PostgreSQL through the same path (the recoverers give each job its organization).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from django_rq.queues import DjangoRQ
from redis import Redis, WatchError
from rq import Queue
from rq.exceptions import DequeueTimeout, DuplicateJobError, NoSuchJobError
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job, JobStatus
from rq.utils import as_text

from crm import fairshare_scripts as scripts
from crm import queues

PREFIX = "crm:fair:"
WEIGHTS = f"{PREFIX}weights"
PLAIN = "_"  # the pseudo-tenant standing for RQ's own list of a queue (jobs without a tenant)
WAKE_CAP = 16  # wake tokens kept per queue: enough to wake the idle workers, bounded
# Turns a tenant that had nothing waiting may take ahead of the others (as Linux CFS credits a
# task that slept): a small batch beside a flood finishes in about its time alone, while a
# tenant that stays busy is served strictly in turn.
BURST = 4
MAX_STALE = 100  # deleted or canceled ids a pick skips before it gives up for this call


def ready_key(queue: str) -> str:
    return f"{PREFIX}{queue}:ready"


def tenant_key(queue: str, tenant: object) -> str:
    return f"{PREFIX}{queue}:t:{tenant}"


def count_key(queue: str) -> str:
    return f"{PREFIX}{queue}:n"


def wake_key(queue: str) -> str:
    return f"{PREFIX}{queue}:wake"


def parked_key(queue: str) -> str:
    return f"{PREFIX}{queue}:parked"


_scripts: dict[str, Any] = {}


def _script(connection: Any, source: str) -> Any:
    # One Script per source: it is always called with an explicit client (a connection or a
    # pipeline), so the client it was first registered on does not matter.
    script = _scripts.get(source)
    if script is None:
        script = _scripts[source] = connection.register_script(source)
    return script


def job_tenant(job: Job) -> str | None:
    """The tenant a job is served as: its organization, or None (RQ's own list)."""
    org = (job.meta or {}).get("organization_id")
    return None if org is None else str(org)


def push(
    connection: Any,
    *,
    queue: str,
    tenant: str,
    job_id: str,
    at_front: bool = False,
    start: float | None = None,
) -> None:
    """Put a job id at the tail (or head) of its tenant's list on `queue` (a pipeline works too); a
    tenant that had nothing waiting joins BURST turns before the queue's time, or at `start`."""
    script = _script(connection, scripts.PUSH)
    script(
        keys=[
            ready_key(queue),
            tenant_key(queue, tenant),
            f"{PREFIX}{queue}:vt",
            count_key(queue),
            wake_key(queue),
            WEIGHTS,
            parked_key(queue),
        ],
        args=[
            tenant,
            job_id,
            "1" if at_front else "0",
            WAKE_CAP,
            BURST,
            "" if start is None else repr(start),
        ],
        client=connection,
    )


def pick(connection: Redis, queue_names: Sequence[str]) -> tuple[str, str, str, float] | None:
    """The next job of these queues (priority order), tenants in turn: (queue, job id, tenant, the
    tenant's score after this turn), already moved to the queue's intermediate list; None when
    every queue is empty."""
    result = _script(connection, scripts.PICK)(
        keys=[WEIGHTS], args=[PREFIX, MAX_STALE, BURST, repr(time.time()), *queue_names], client=connection
    )
    if not result:
        return None
    queue, job_id, tenant, after = (as_text(x) for x in result)
    return queue, job_id, tenant, float(after)


def turn_score(job: Job) -> float | None:
    """The score of the job's tenant after the turn that picked this job (None: not picked by
    `pick`, e.g. outside a worker): where the tenant stands while it has nothing else waiting."""
    score = getattr(job, "_fair_turn_score", None)
    return None if score is None else float(score)


def queues_before(job: Job) -> list[str]:
    """The queues the worker that picked this job serves before the job's own (empty when not
    picked by `pick`): their work comes first at the next pick, whatever its tenant."""
    return list(getattr(job, "_fair_queues_before", ()))


def wait_for_work(connection: Redis, queue_names: Sequence[str], timeout: int) -> bool:
    """Block up to `timeout` s until a producer signals work on one of these queues."""
    return connection.blpop([wake_key(q) for q in queue_names], timeout) is not None


def park(connection: Any, *, queue: str, tenant: str, job_id: str, until: float) -> None:
    """Put a job back at the head of its tenant's list on `queue` and keep the tenant out of the
    ready set until `until` (unix s; a pipeline works too): a tenant that can run nothing before
    then (its own rate limit) is not picked only to be put back, each such pick a turn the other
    tenants lose. The first pick after `until` re-admits it, in turn; jobs pushed meanwhile wait in
    its list."""
    keys = [ready_key(queue), tenant_key(queue, tenant), count_key(queue), parked_key(queue)]
    _script(connection, scripts.PARK)(keys=keys, args=[tenant, job_id, repr(until)], client=connection)


def parked_waiting(connection: Redis, queue_names: Sequence[str]) -> int:
    """Jobs waiting in the lists of parked tenants of these queues (a burst worker's check)."""
    with connection.pipeline(transaction=False) as pipe:
        for q in queue_names:
            pipe.zrange(parked_key(q), 0, -1)
        parked = [(q, as_text(t)) for q, row in zip(queue_names, pipe.execute(), strict=True) for t in row]
    if not parked:
        return 0
    with connection.pipeline(transaction=False) as pipe:
        for q, t in parked:
            pipe.llen(tenant_key(q, t))
        return sum(int(n) for n in pipe.execute())


def next_parked(connection: Redis, queue_names: Sequence[str]) -> float | None:
    """When the first parked tenant of these queues is due (unix s), or None."""
    with connection.pipeline(transaction=False) as pipe:
        for q in queue_names:
            pipe.zrange(parked_key(q), 0, 0, withscores=True)
        heads = [row[0][1] for row in pipe.execute() if row]
    return min(heads) if heads else None


def others_ahead(
    connection: Redis, queue: str, tenant: str, score: float | None = None, *, before: Sequence[str] = ()
) -> bool:
    """Whether another tenant's work waiting on `queue` would be picked before `tenant`'s next job
    (`score`: the tenant's after its last turn, `turn_score`), or any work waits on the queues
    `before` it in the worker's order (`queues_before`); one script, O(log tenants + queues): a long
    job of `tenant` gives its turn then (crm.jobs.yield_turn)."""
    keys = [ready_key(queue), f"{PREFIX}{queue}:vt", f"rq:queue:{queue}"]
    for name in before:
        keys += [ready_key(name), f"rq:queue:{name}"]
    args = [tenant, BURST, "" if score is None else repr(score)]
    return bool(_script(connection, scripts.AHEAD)(keys=keys, args=args, client=connection))


def set_weight(connection: Redis, organization_id: int, weight: int) -> None:
    """An organization's share of turns (default 1): weight 2 is served twice as often."""
    if weight == 1:
        connection.hdel(WEIGHTS, str(organization_id))
    else:
        connection.hset(WEIGHTS, str(organization_id), max(int(weight), 1))


def weights_replace(connection: Redis, weights: Mapping[int, int]) -> None:
    """Make `crm:fair:weights` exactly `weights` (organization id → weight; those of 1 may be
    left out): one MULTI, so a pick never sees it half written."""
    kept = {str(org): str(max(int(w), 1)) for org, w in weights.items() if int(w) != 1}
    with connection.pipeline(transaction=True) as pipe:
        pipe.delete(WEIGHTS)
        if kept:
            pipe.hset(WEIGHTS, mapping=cast(Any, kept))
        pipe.execute()


def waiting(connection: Redis, queue_names: Iterable[str]) -> dict[str, int]:
    """Jobs waiting in the tenants' lists per queue (RQ's own list is counted by RQ)."""
    names = list(queue_names)
    with connection.pipeline(transaction=False) as pipe:
        for q in names:
            pipe.get(count_key(q))
        return {q: max(int(v or 0), 0) for q, v in zip(names, pipe.execute(), strict=True)}


def tenant_counts(connection: Redis, queue: str, *, limit: int = 1000) -> list[tuple[str, int]]:
    """(tenant, waiting) of up to `limit` ready tenants of a queue, most waiting first; the plain
    list counts as tenant `_`. Bounded: one ZRANGE and `limit` LLENs in one round trip."""
    tenants = waiting_tenants(connection, queue, limit)
    with connection.pipeline(transaction=False) as pipe:
        for t in tenants:
            pipe.llen(f"rq:queue:{queue}" if t == PLAIN else tenant_key(queue, t))
        counts = pipe.execute()
    rows = [(t, int(c)) for t, c in zip(tenants, counts, strict=True) if c]
    return sorted(rows, key=lambda r: (-r[1], r[0]))


def waiting_tenants(connection: Redis, queue: str, limit: int) -> list[str]:
    """Up to `limit` (-1: all) tenants with work waiting on a queue in the order they are served:
    the ready set, then the parked tenants by the time they rejoin. One round trip."""
    stop = -1 if limit < 0 else limit - 1
    with connection.pipeline(transaction=False) as pipe:
        pipe.zrange(ready_key(queue), 0, stop)
        pipe.zrange(parked_key(queue), 0, stop)
        ready, parked = pipe.execute()
    tenants = list(dict.fromkeys(as_text(t) for t in [*ready, *parked]))
    return tenants if limit < 0 else tenants[:limit]


def ready_tenants(connection: Redis, queue: str) -> int:
    return int(connection.zcard(ready_key(queue)))


class FairIntermediateQueue(IntermediateQueue):
    """RQ's intermediate list, swept differently: a job taken by a worker that died before it
    started (still `queued`, not in the started registry, seen there for a minute) goes back to
    the head of its tenant's list with its attempts untouched; RQ would fail or retry it."""

    def cleanup(self, worker: Any, queue: Queue) -> None:
        for job_id in self.get_job_ids():
            if job_id in queue.started_job_registry:
                continue
            if self.set_first_seen(job_id) or not self.should_be_cleaned_up(job_id):
                continue
            try:
                job: Job | None = Job.fetch(job_id, connection=self.connection, serializer=queue.serializer)
            except NoSuchJobError:
                job = None
            with self.connection.pipeline() as pipe:
                pipe.lrem(self.key, 1, job_id)
                pipe.delete(self.get_first_seen_key(job_id))
                if job is not None and job.get_status(refresh=False) == JobStatus.QUEUED:
                    assert isinstance(queue, FairQueue)
                    queue.push_job(job, pipe, at_front=True)
                pipe.execute()


class FairQueue(DjangoRQ):
    """An RQ queue whose jobs with an organization wait in per-tenant lists, served in turn
    (settings.RQ's QUEUE_CLASS: every queue of the project, the django-rq dashboard's too)."""

    def push_job(self, job: Job, pipeline: Any, *, at_front: bool = False) -> None:
        """Push a saved job: to its tenant's list on a fair queue, else to RQ's list."""
        tenant = job_tenant(job) if queues.is_fair(self.name) else None
        if tenant is None:
            self.push_job_id(job.id, pipeline=pipeline, at_front=at_front)
            pipeline.rpush(wake_key(self.name), "1")
            pipeline.ltrim(wake_key(self.name), 0, WAKE_CAP - 1)
        else:
            push(pipeline, queue=self.name, tenant=tenant, job_id=job.id, at_front=at_front)

    def parks(self, job: Job) -> bool:
        """Whether `park_job` can take this job: it has a tenant on a fair queue (else crm.jobs.Park
        is a Defer)."""
        return queues.is_fair(self.name) and job_tenant(job) is not None

    def park_job(self, job: Job, pipeline: Any, *, seconds: float) -> None:
        """Queue a job whose tenant can run nothing on this queue for `seconds` (crm.jobs.Park)
        again at the head of its tenant's list, the tenant parked until then (`park`)."""
        tenant = job_tenant(job)
        assert tenant is not None and queues.is_fair(self.name)
        self._prepare_for_queue(job)
        self._persist_job(job, pipeline)
        park(pipeline, queue=self.name, tenant=tenant, job_id=job.id, until=time.time() + seconds)

    def push_yielded(self, job: Job, pipeline: Any) -> None:
        """Queue a job that gave its turn (crm.jobs.Yield) again at the head of its tenant's list;
        a tenant with nothing else waiting rejoins where its turn left it (no newly-ready credit:
        the tenants it yielded to go first). In `pipeline`."""
        self._prepare_for_queue(job)
        self._persist_job(job, pipeline)
        tenant = job_tenant(job) if queues.is_fair(self.name) else None
        if tenant is None:
            self.push_job(job, pipeline, at_front=True)
        else:
            start = turn_score(job)
            if start is None:  # not taken by `pick`: at the queue's time, no credit
                start = float(self.connection.get(f"{PREFIX}{self.name}:vt") or 0)
            push(pipeline, queue=self.name, tenant=tenant, job_id=job.id, at_front=True, start=start)

    def _enqueue_async_job(
        self, job: Job, pipeline: Any = None, at_front: bool = False, unique: bool = False
    ) -> Job:
        # RQ's own, with the push through push_job; `unique` checked under WATCH of the job key so
        # two producers of one id cannot both push it.
        is_deferred = job.get_status(refresh=False) == JobStatus.DEFERRED
        self._prepare_for_queue(job)
        if unique:
            self._enqueue_unique(job, at_front=at_front)
            return job
        pipe = pipeline if pipeline is not None else self.connection.pipeline()
        if is_deferred:
            self.deferred_job_registry.remove(job, pipeline=pipe)
        self._persist_job(job, pipe)
        self.push_job(job, pipe, at_front=at_front)
        if pipeline is None:
            pipe.execute()
        return job

    def _enqueue_unique(self, job: Job, *, at_front: bool) -> None:
        with self.connection.pipeline() as pipe:
            try:
                pipe.watch(job.key)
                if pipe.exists(job.key):
                    raise DuplicateJobError(f"Job with ID '{job.id}' already exists")
                pipe.multi()
                self._persist_job(job, pipe)
                self.push_job(job, pipe, at_front=at_front)
                pipe.execute()
            except WatchError:
                raise DuplicateJobError(f"Job with ID '{job.id}' already exists") from None

    @property
    def intermediate_queue(self) -> IntermediateQueue:
        return FairIntermediateQueue(self.key, connection=self.connection)

    @property
    def count(self) -> int:
        """Waiting jobs: RQ's own list and the tenants' lists."""
        return int(self.connection.llen(self.key)) + waiting(self.connection, [self.name])[self.name]

    @classmethod
    def dequeue_any(
        cls,
        queues: Iterable[Queue],
        timeout: int | None,
        connection: Redis,
        job_class: type[Job] | None = None,
        serializer: Any = None,
        death_penalty_class: Any = None,
    ) -> tuple[Job, Queue] | None:
        """The next job, tenants in turn within each queue (see the module docstring); with a
        timeout, blocks on the producers' wake signal until work comes or it runs out."""
        by_name = {q.name: q for q in queues}
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            picked = pick(connection, list(by_name))
            if picked is None:
                if deadline is None:
                    return None  # a burst worker: parked tenants are waited for as delayed jobs are
                due = next_parked(connection, list(by_name))
                # A parked tenant's time bounds the wait: it is picked when due, whoever wakes.
                left = deadline - time.monotonic()
                until_due = float("inf") if due is None else max(due - time.time(), 0.0)
                if left <= 0:
                    raise DequeueTimeout(timeout, list(by_name))
                woken = wait_for_work(connection, list(by_name), max(int(min(left, until_due) + 0.999), 1))
                if not woken and until_due >= left:
                    raise DequeueTimeout(timeout, list(by_name))
                continue
            name, job_id, _tenant, score = picked
            queue = by_name[name]
            try:
                job = queue.job_class.fetch(job_id, connection=connection, serializer=queue.serializer)
            except NoSuchJobError:
                connection.lrem(queue.intermediate_queue_key, 1, job_id)
                continue
            except Exception as exc:
                # A hash RQ cannot load: as RQ's own dequeue does, the job and queue travel with the
                # error, so the worker fails that job (crm.worker) instead of dying of it.
                exc.job_id, exc.queue = job_id, queue  # type: ignore[attr-defined]
                raise
            job._fair_turn_score = score  # type: ignore[attr-defined]  # turn_score, yield_turn
            names = list(by_name)
            job._fair_queues_before = names[: names.index(name)]  # type: ignore[attr-defined]
            return job, queue


def queued_ids(connection: Redis, queue: str, *, limit: int = 1000) -> list[str]:
    """Ids waiting on a queue, RQ's own list first, then each ready tenant's (up to `limit` each)."""
    tenants = waiting_tenants(connection, queue, -1)
    with connection.pipeline(transaction=False) as pipe:
        pipe.lrange(f"rq:queue:{queue}", 0, limit - 1)
        for t in tenants:
            if t != PLAIN:
                pipe.lrange(tenant_key(queue, t), 0, limit - 1)
        return [as_text(i) for ids in pipe.execute() for i in ids]


def remove(connection: Redis, queue: str, job: Job) -> bool:
    """Take a waiting job off its tenant's list; False if it is not there (a worker took it).
    (RQ's own delete and cancel only leave its id behind: a pick skips ids whose job is not
    queued; this keeps the counts exact too.)"""
    tenant = job_tenant(job)
    if tenant is None:
        return False
    keys = [ready_key(queue), tenant_key(queue, tenant), count_key(queue), parked_key(queue)]
    return bool(_script(connection, scripts.REMOVE)(keys=keys, args=[tenant, job.id], client=connection))


def drain(connection: Redis, queue: str, limit: int, *, batch: int = 1000) -> int:
    """Delete up to `limit` waiting jobs of the tenants' lists, tenant after tenant; how many."""
    done = 0
    while done < limit:
        tenants = waiting_tenants(connection, queue, 100)
        tenants = [t for t in tenants if t != PLAIN]
        if not tenants:
            break
        for tenant in tenants:
            keys = [ready_key(queue), tenant_key(queue, tenant), count_key(queue), parked_key(queue)]
            args = [min(batch, limit - done), "rq:job:", tenant]
            done += int(_script(connection, scripts.DRAIN)(keys=keys, args=args, client=connection))
            if done >= limit:
                break
    return done


def waiting_page(connection: Redis, queue: str, start: int, stop: int) -> list[str]:
    """Ids at positions [start, stop) of the tenants' lists, tenant after tenant in the order they
    are served next (at most the first 1,000 tenants: a page, not an export)."""
    tenants = [t for t in waiting_tenants(connection, queue, 1000) if t != PLAIN]
    with connection.pipeline(transaction=False) as pipe:
        for t in tenants:
            pipe.llen(tenant_key(queue, t))
        lengths = pipe.execute()
    ids: list[str] = []
    offset = 0
    for tenant, length in zip(tenants, lengths, strict=True):
        lo, hi = max(start - offset, 0), min(stop - offset, length)
        if lo < hi:
            ids += [as_text(i) for i in connection.lrange(tenant_key(queue, tenant), lo, hi - 1)]
        offset += length
        if offset >= stop:
            break
    return ids


def tenant_summary(connection: Redis, queue: str, *, top: int = 10, scan: int = 1000) -> dict[str, Any]:
    """The operators' view of a queue's tenants: how many have work waiting (`ready`), the `top`
    by waiting jobs with their share of turns (weight over the ready tenants' weights), and what
    the rest hold (`other_waiting`). Bounded: reads at most `scan` tenants."""
    rows = tenant_counts(connection, queue, limit=scan)
    ready = ready_tenants(connection, queue)
    weights = connection.hmget(WEIGHTS, [t for t, _ in rows]) if rows else []
    weight = {t: max(int(w or 1), 1) for (t, _), w in zip(rows, weights, strict=True)}
    total_weight = sum(weight.values()) + max(ready - len(rows), 0)
    listed = rows[:top]
    return {
        "ready": ready,
        "tenants": [
            {
                "organization_id": None if t == PLAIN else int(t),
                "waiting": n,
                "share": round(weight[t] / total_weight, 4) if total_weight else 0.0,
            }
            for t, n in listed
        ],
        "other_waiting": sum(n for _, n in rows[top:]),
    }
