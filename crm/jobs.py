"""The one way to enqueue work: every producer (services, scheduler, webhooks, admin) calls these.

Payloads are JSON of ids and plain values only, never credentials; jobs read secrets fresh from
the database. Enqueueing inside a transaction happens after it commits.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import django_rq
from django.db import transaction
from redis import Redis
from rq import Queue, Retry, get_current_job
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Callback, Job
from rq.results import Result
from rq.serializers import JSONSerializer

from crm import fairshare, queues

logger = logging.getLogger(__name__)

BULK_CHUNK = 1000
FAILURE_CALLBACK = Callback("crm.recovery.job_failed")

# Keys that name a credential. Jobs carry ids; the job reads the secret from the database.
_CREDENTIAL_WORDS = (
    "password",
    "passwd",
    "secret",
    "access_token",
    "api_key",
    "apikey",
    "authorization",
    "credential",
    "private_key",
    "auth_token",
    "bearer",
)


class PayloadError(ValueError):
    """A job payload that is not plain JSON values, or that carries a credential."""


class Defer(Exception):
    """Raise inside a job to run it again later without spending an attempt ("delay, don't fail").

    For rate limits, an open circuit or a paused handler: the job is put back in the scheduled
    registry `seconds` from now with its retries untouched. `at_front`: when due, it runs before
    the jobs queued meanwhile (work under way that only waits for its slot); else after them.
    """

    def __init__(self, seconds: float, reason: str = "", *, at_front: bool = False) -> None:
        super().__init__(reason or f"deferred {seconds}s")
        self.seconds = max(float(seconds), 0.0)
        self.reason = reason
        self.at_front = at_front


class Yield(Defer):
    """Raised by `yield_turn`: the job goes back at once to the head of its tenant's list on its
    fair queue, its attempts untouched, and the next tenant in turn runs before it resumes."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(0, reason or "gives its turn to another tenant", at_front=True)


class Park(Defer):
    """Raise when the job's tenant can run nothing on this queue for `seconds` (its own rate limit):
    on a fair queue the job goes back to the head of its tenant's list, attempts untouched, and the
    tenant leaves the queue's ready set until then (crm.fairshare.park), so its other waiting jobs
    are not picked only to be put back, each such pick a turn lost by the other tenants. Off a fair
    queue, or for a job without a tenant, it is a Defer."""


def yield_turn(reason: str = "") -> None:
    """Between the chunks of a long job on a fair queue (a send batch): raise Yield when its turn is
    due to other work (`turn_waits`), so that work comes now instead of after the whole job; the job
    must resume from where it stopped when it runs again. Returns otherwise, and outside a worker."""
    if turn_waits():
        raise Yield(reason)


def turn_waits() -> bool:
    """Whether the running job on a fair queue should give its turn: another tenant's work waiting
    on its queue would be served before its tenant's next job, or work waits on a queue the worker
    serves first (a campaign's trigger, a webhook). False outside a worker or off a fair queue."""
    job = get_current_job()
    if job is None or not queues.is_fair(job.origin):
        return False
    tenant = fairshare.job_tenant(job) or fairshare.PLAIN
    score, before = fairshare.turn_score(job), fairshare.queues_before(job)
    return fairshare.others_ahead(job.connection, job.origin, tenant, score, before=before)


def check_payload(value: Any, path: str = "kwargs") -> None:
    """Raise PayloadError unless `value` is plain JSON with no credential-named keys."""
    if value is None or isinstance(value, bool | int | float | str):
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_payload(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"{path} has a non-string key {key!r}")
            lowered = key.lower()
            if any(word in lowered for word in _CREDENTIAL_WORDS):
                raise PayloadError(
                    f"{path}.{key} looks like a credential; job payloads carry ids and the job reads "
                    "secrets from the database"
                )
            check_payload(item, f"{path}.{key}")
        return
    raise PayloadError(
        f"{path} is a {type(value).__name__}; job payloads carry ids and plain values "
        "(pass an id, or an ISO string for a datetime)"
    )


_JOB_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def make_job_id(*parts: object) -> str:
    """A deterministic job id from parts; RQ allows only letters, digits, '_' and '-'."""
    return "-".join(_JOB_ID_UNSAFE.sub("_", str(p)) for p in parts)


def func_path(func: str | Callable[..., Any]) -> str:
    if isinstance(func, str):
        return func
    return f"{func.__module__}.{func.__qualname__}"


_client: tuple[int, Redis] | None = None
_client_lock = threading.Lock()


def get_connection() -> Redis:
    """The process's Redis client (every queue shares one Redis). One per process, not per call:
    django-rq builds a new client, with its own pool and TCP connection, every time it is asked."""
    global _client
    client = _client
    if client is not None and client[0] == os.getpid():
        return client[1]
    with _client_lock:
        if _client is None or _client[0] != os.getpid():  # first use, or a forked child
            _client = (os.getpid(), django_rq.get_connection(queues.QUEUE_NAMES[0]))
        return _client[1]


def get_queue(name: str) -> Queue:
    """The raw RQ queue (no commit deferral: `enqueue` handles that itself)."""
    queues.get_spec(name)
    return django_rq.get_queue(
        name,
        commit_mode="auto",
        serializer=JSONSerializer,
        connection=get_connection(),
        queue_class=fairshare.FairQueue,
    )


@dataclass
class JobSpec:
    """Everything needed to enqueue one job; also what recoverers yield."""

    func: str
    queue: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    job_id: str | None = None
    description: str | None = None
    at: datetime | None = None  # run at this time (a scheduled campaign), not now
    organization_id: int | None = None  # the tenant, for the worker's log line (job.meta)


def _retry_for(spec: queues.QueueSpec, attempts: int | None, backoff: int | None) -> Retry | None:
    attempts = spec.attempts if attempts is None else attempts
    backoff = spec.backoff if backoff is None else backoff
    if attempts <= 1:
        return None
    return Retry(max=attempts - 1, interval=[backoff * 2**i for i in range(attempts - 1)] if backoff else 0)


def _job_options(
    spec: queues.QueueSpec,
    *,
    attempts: int | None,
    backoff: int | None,
    timeout: int | None,
    result_ttl: int | None,
    meta: dict | None,
) -> dict[str, Any]:
    options: dict[str, Any] = {
        "retry": _retry_for(spec, attempts, backoff),
        "timeout": timeout or spec.timeout,
        "result_ttl": spec.result_ttl if result_ttl is None else result_ttl,
        "failure_ttl": 7 * 24 * 3600,
        # Work that fails for good ends for good (crm.recovery's module docstring).
        "on_failure": FAILURE_CALLBACK,
    }
    if meta:
        options["meta"] = meta
    return options


def enqueue(
    func: str | Callable[..., Any],
    *,
    queue: str,
    kwargs: dict[str, Any] | None = None,
    job_id: str | None = None,
    delay: float | timedelta | None = None,
    at: datetime | None = None,
    unique: bool = False,
    replace: bool = False,
    attempts: int | None = None,
    backoff: int | None = None,
    timeout: int | None = None,
    result_ttl: int | None = None,
    description: str | None = None,
    meta: dict[str, Any] | None = None,
    organization_id: int | None = None,
    after_commit: bool = True,
) -> str:
    """Enqueue one job (after the current transaction commits) and return its id.

    after_commit=False enqueues at once, for a caller with no transaction of its own that must not
    open a database connection just to learn that (crm.inbox's waker thread).
    unique=True: if a job with `job_id` still exists (queued, running, delayed or kept after it
    finished), nothing is enqueued — BullMQ's fixed-jobId behaviour. replace=True: an existing job
    with that id is cancelled and deleted first (editing a schedule replaces it).
    `attempts` counts every run, the first included; backoff doubles from `backoff` seconds.
    `organization_id` goes into job.meta (saved with the job), for the worker's log line.
    """
    spec = queues.get_spec(queue)
    kwargs = dict(kwargs or {})
    meta = _enqueue_checked(
        kwargs,
        meta=meta,
        organization_id=organization_id,
        job_id=job_id,
        unique=unique,
        replace=replace,
        delay=delay,
        at=at,
    )
    job_id = job_id or uuid.uuid4().hex
    path = func_path(func)
    options = _job_options(
        spec, attempts=attempts, backoff=backoff, timeout=timeout, result_ttl=result_ttl, meta=meta
    )
    push = functools.partial(
        _push,
        queue=queue,
        path=path,
        job_id=job_id,
        kwargs=kwargs,
        description=description or path,
        unique=unique,
        replace=replace,
        at=at,
        delay=delay,
        options=options,
    )
    if after_commit:
        transaction.on_commit(push)  # runs at once outside an atomic block
    else:
        push()
    return job_id


def _enqueue_checked(
    kwargs: dict[str, Any],
    *,
    meta: dict[str, Any] | None,
    organization_id: int | None,
    job_id: str | None,
    unique: bool,
    replace: bool,
    delay: float | timedelta | None,
    at: datetime | None,
) -> dict[str, Any] | None:
    """enqueue's arguments checked (ValueError says which is wrong); returns the job's meta, the
    organization's id in it."""
    check_payload(kwargs)
    if organization_id is not None:
        meta = {**(meta or {}), "organization_id": organization_id}
    if meta:
        check_payload(meta, "meta")
    if (unique or replace) and not job_id:
        raise ValueError("unique and replace need an explicit job_id")
    if unique and replace:
        raise ValueError("unique and replace exclude each other")
    if delay is not None and at is not None:
        raise ValueError("give delay or at, not both")
    if at is not None and at.tzinfo is None:
        raise ValueError("at must be an aware datetime")
    return meta


def _push(
    *,
    queue: str,
    path: str,
    job_id: str,
    kwargs: dict[str, Any],
    description: str,
    unique: bool,
    replace: bool,
    at: datetime | None,
    delay: float | timedelta | None,
    options: dict[str, Any],
) -> None:
    """Put one job on its RQ queue (enqueue's last step, after the commit): at a time, after a
    delay, or now; a job that already exists with that id is logged and left alone."""
    rq_queue = get_queue(queue)
    if replace:
        delete_job(job_id)
    common = dict(
        kwargs=kwargs,
        job_id=job_id,
        description=description,
        unique=unique,
        job_timeout=options["timeout"],
        **{k: v for k, v in options.items() if k != "timeout"},
    )
    try:
        if at is not None:
            rq_queue.enqueue_at(at, path, **common)
        elif delay:
            seconds = delay if isinstance(delay, timedelta) else timedelta(seconds=delay)
            rq_queue.enqueue_in(seconds, path, **common)
        else:
            rq_queue.enqueue(path, **common)
    except DuplicateJobError:
        logger.info("job %s already exists on %s; not enqueued again", job_id, queue)


def enqueue_many(
    func: str | Callable[..., Any],
    *,
    queue: str,
    kwargs_list: Iterable[dict[str, Any]],
    job_ids: Sequence[str] | None = None,
    attempts: int | None = None,
    backoff: int | None = None,
    timeout: int | None = None,
    result_ttl: int | None = None,
    organization_id: int | None = None,
    organization_ids: Sequence[int | None] | None = None,
) -> list[str]:
    """Enqueue many jobs of one function in pipelines of BULK_CHUNK (one round trip each).

    The tenant goes into each job's meta, for the worker's log line: `organization_id` for all of
    them, or `organization_ids`, one per job like `job_ids`."""
    spec = queues.get_spec(queue)
    path = func_path(func)
    items = [dict(k) for k in kwargs_list]
    for i, k in enumerate(items):
        check_payload(k, f"kwargs_list[{i}]")
    ids = list(job_ids) if job_ids is not None else [uuid.uuid4().hex for _ in items]
    if len(ids) != len(items):
        raise ValueError("job_ids and kwargs_list differ in length")
    orgs = list(organization_ids) if organization_ids is not None else [organization_id] * len(items)
    if len(orgs) != len(items):
        raise ValueError("organization_ids and kwargs_list differ in length")
    options = _job_options(
        spec, attempts=attempts, backoff=backoff, timeout=timeout, result_ttl=result_ttl, meta=None
    )

    def _do() -> None:
        rq_queue = get_queue(queue)
        for start in range(0, len(items), BULK_CHUNK):
            end = start + BULK_CHUNK
            data = [
                Queue.prepare_data(
                    path,
                    kwargs=k,
                    job_id=jid,
                    description=path,
                    meta=None if org is None else {"organization_id": org},
                    **options,
                )
                for k, jid, org in zip(items[start:end], ids[start:end], orgs[start:end], strict=True)
            ]
            with rq_queue.connection.pipeline() as pipe:
                rq_queue.enqueue_many(data, pipeline=pipe)
                pipe.execute()

    transaction.on_commit(_do)
    return ids


def enqueue_specs(specs: Iterable[JobSpec]) -> int:
    """Enqueue JobSpecs (grouped by queue and function) in bulk; returns how many."""
    groups: dict[tuple[str, str], list[JobSpec]] = {}
    total = 0
    for s in specs:
        if s.at is not None:  # few (scheduled starts): one by one
            enqueue(
                s.func,
                queue=s.queue,
                kwargs=s.kwargs,
                job_id=s.job_id,
                at=s.at,
                description=s.description,
                organization_id=s.organization_id,
            )
            total += 1
        else:
            groups.setdefault((s.queue, s.func), []).append(s)
    for (queue, func), group in groups.items():
        enqueue_many(
            func,
            queue=queue,
            kwargs_list=[s.kwargs for s in group],
            job_ids=[s.job_id or uuid.uuid4().hex for s in group],
            organization_ids=[s.organization_id for s in group],
        )
        total += len(group)
    return total


def delete_job(job_id: str) -> bool:
    """Delete a job wherever it is (queue, delayed, failed, …), with its results: whatever its
    status says, it is in no registry afterwards. True if it existed."""
    connection = get_connection()
    try:
        job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
    except NoSuchJobError:
        return False
    keys = queues.redis_keys(job.origin)
    fairshare.remove(connection, job.origin, job)
    with connection.pipeline() as pipe:
        job.delete(pipeline=pipe, remove_from_queue=True)
        for name in ("failed", "completed", "scheduled", "deferred", "canceled"):
            pipe.zrem(keys[name], job.id)
        pipe.delete(Result.get_key(job.id))
        pipe.execute()
    return True


def fetch_job(job_id: str) -> Job | None:
    try:
        return Job.fetch(job_id, connection=get_connection(), serializer=JSONSerializer)
    except NoSuchJobError:
        return None


def jobs_alive(job_ids: Sequence[str]) -> list[bool]:
    """For each id: does Redis hold that job in a state that will still run it?

    One pipelined round trip per BULK_CHUNK ids. A job that is queued, delayed (scheduled,
    deferred) or running counts; finished, failed, stopped, canceled or missing does not.
    """
    connection = get_connection()
    alive: list[bool] = []
    for start in range(0, len(job_ids), BULK_CHUNK):
        chunk = job_ids[start : start + BULK_CHUNK]
        with connection.pipeline(transaction=False) as pipe:
            for jid in chunk:
                pipe.hget(f"{Job.redis_job_namespace_prefix}{jid}", "status")
            statuses = pipe.execute()
        alive.extend(
            (s.decode() if isinstance(s, bytes) else s) in ("queued", "scheduled", "deferred", "started")
            for s in statuses
        )
    return alive


@dataclass(frozen=True)
class Pending:
    """One pending job per key however many writers ask for one (an inbox kind's drain, an
    organization's Chatwoot push): a "dirty" flag says work was written, a "queued" marker (with a
    TTL, so a job that died frees it) says a job is queued or running for the key.

    Writers call `wake` after their commit: it sets the flag and enqueues only when it takes the
    marker. The job calls `begin` before each pass over the waiting work (the flag cleared before
    it reads, so work committed during the pass leaves the flag set) and `finish` when it ran out:
    the marker is given back, then taken again if the flag is set (True: pass again). A write
    during the job's last moments either finds no marker (and enqueues a job) or set the flag
    before `finish` looks, so nothing is left waiting; N writes during a pass cost one more pass."""

    space: str  # the keys' middle part: crm:<space>:dirty:<key>, crm:<space>:queued:<key>
    ttl: int  # seconds the marker outlives a job that died holding it

    def dirty_key(self, key: object) -> str:
        return f"crm:{self.space}:dirty:{key}"

    def queued_key(self, key: object) -> str:
        return f"crm:{self.space}:queued:{key}"

    def wake(self, key: object, enqueue: Callable[[], object]) -> bool:
        """Mark `key` dirty and call `enqueue` unless a job is queued or running; True if called."""
        with get_connection().pipeline(transaction=False) as pipe:
            pipe.set(self.dirty_key(key), 1)
            pipe.set(self.queued_key(key), 1, nx=True, ex=self.ttl)
            _, taken = pipe.execute()
        if taken:
            enqueue()
        return bool(taken)

    def begin(self, key: object) -> None:
        """Before a pass: clear the flag and hold the marker (taken over by a job `recover`
        enqueued after the marker's job was lost)."""
        with get_connection().pipeline(transaction=False) as pipe:
            pipe.delete(self.dirty_key(key))
            pipe.set(self.queued_key(key), 1, ex=self.ttl)
            pipe.execute()

    def keep(self, key: object, ttl: int | None = None) -> None:
        """The job still works (or waits deferred): its marker lives on, `ttl` seconds (default:
        the usual) from now."""
        get_connection().expire(self.queued_key(key), ttl or self.ttl)

    def dirty(self, key: object) -> bool:
        return bool(get_connection().exists(self.dirty_key(key)))

    def release(self, key: object) -> None:
        get_connection().delete(self.queued_key(key))

    def finish(self, key: object) -> bool:
        """Out of work: give the marker back; True (the marker taken again) if work was written
        since the last `begin`, and the caller passes again."""
        connection = get_connection()
        connection.delete(self.queued_key(key))
        return bool(
            connection.exists(self.dirty_key(key))
            and connection.set(self.queued_key(key), 1, nx=True, ex=self.ttl)
        )
