"""The queue pages' Redis side: counts, pages of jobs, search and one job's detail (the operators'
actions on them: crm.queue_actions).

Plain values in and out, no HTTP. Lists are read by index ranges (LRANGE/ZRANGE) and one pipeline
per page, never by loading every id."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from redis import Redis
from rq import Worker
from rq.exceptions import DeserializationError
from rq.job import Job, JobStatus
from rq.results import Result
from rq.serializers import JSONSerializer

from crm import fairshare, jobs, queues, stats
from crm.models import Organization

STATES = ("waiting", "active", "delayed", "completed", "failed")
JOB_ACTIONS = ("retry", "delete", "promote", "cancel")
# Each bulk action and the one state it applies to.
BULK_ACTIONS = {"retry-all": "failed", "delete-all": "failed", "empty": "waiting", "promote-all": "delayed"}

PAGE_SIZE = 50
SEARCH_LIMIT = 10_000
SEARCH_CHUNK = 500
BULK = 1000
SUMMARY_CHARS = 80

_JOB = Job.redis_job_namespace_prefix
_LIVE = {JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED, JobStatus.STARTED, JobStatus.CREATED}
# Which list a job of each status is shown in.
STATE_OF_STATUS = {
    JobStatus.QUEUED: "waiting",
    JobStatus.STARTED: "active",
    JobStatus.SCHEDULED: "delayed",
    JobStatus.DEFERRED: "delayed",
    JobStatus.FINISHED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.STOPPED: "failed",
}


class JobGone(LookupError):
    """The job's hash is not in Redis (deleted, or expired with its result/failure TTL)."""


class WrongState(Exception):
    """The action does not apply to the job as it is now; nothing was changed."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


Entry = tuple[str, float | None]  # a job id and, for a scheduled job, when it is due


@dataclass
class JobRow:
    id: str
    exists: bool = True
    status: str = ""
    func: str = ""
    arguments: str = ""
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    due_at: datetime | None = None
    attempts_left: int | None = None
    exception: str = ""


@dataclass
class JobPage:
    rows: list[JobRow]
    count: int  # jobs in the state, or jobs matched by the search
    page: int
    pages: int
    query: str = ""
    searched: int = 0  # how many jobs the search looked at
    capped: bool = False  # the state holds more than SEARCH_LIMIT jobs: only the newest were searched


@dataclass
class JobDetail:
    id: str
    origin: str
    status: str
    state: str | None  # the list it shows in, None for a canceled job
    func: str
    description: str
    args_json: str
    kwargs_json: str
    meta_json: str
    created_at: datetime | None
    enqueued_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    due_at: datetime | None
    worker_name: str
    timeout: float | None
    retries_left: int | None
    attempts_left: int | None
    queue_attempts: int | None
    result_json: str | None
    traceback: str
    failures: list[tuple[datetime, str]] = field(default_factory=list)
    dependents: list[str] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _status(job: Job, *, refresh: bool = False) -> str:
    status = job.get_status(refresh=refresh)
    return status.value if isinstance(status, JobStatus) else str(status or "")


def is_queue(name: str) -> bool:
    return name in queues.QUEUE_NAMES


# --- the overview -----------------------------------------------------------------------------
def overview() -> list[dict[str, Any]]:
    """One dict per queue in worker order: the five counts, live workers, oldest waiting job's age."""
    counts = stats.queue_stats()
    connection = jobs.get_connection()
    listening: dict[str, list[str]] = {name: [] for name in queues.QUEUE_NAMES}
    for worker in Worker.all(connection=connection, serializer=JSONSerializer):
        for name in worker.queue_names():
            if name in listening:
                listening[name].append(worker.name)
    oldest = {name: round(age, 1) for name, age in stats.oldest_waiting().items()}
    return [
        {
            "name": name,
            **counts[name],
            "workers": len(listening[name]),
            "worker_names": sorted(listening[name]),
            "oldest_waiting_seconds": oldest.get(name),
        }
        for name in queues.QUEUE_NAMES
    ]


def tenants(queue: str, *, top: int = 20) -> dict[str, Any] | None:
    """A fair queue's tenants for its page: `ready` (tenants with work waiting), `rows` (the `top`
    by waiting jobs: organization id and name, waiting, share of turns) and `other_waiting`;
    None for a queue that is not fair. Bounded (crm.fairshare.tenant_summary)."""
    if not queues.is_fair(queue):
        return None
    summary = fairshare.tenant_summary(jobs.get_connection(), queue, top=top)
    ids = [t["organization_id"] for t in summary["tenants"] if t["organization_id"] is not None]
    names = dict(Organization.objects.filter(pk__in=ids).values_list("pk", "name"))
    rows = [{**t, "name": names.get(t["organization_id"], "")} for t in summary["tenants"]]
    return {"ready": summary["ready"], "rows": rows, "other_waiting": summary["other_waiting"]}


# --- pages of jobs ----------------------------------------------------------------------------
def _sizes(connection: Redis, queue: str) -> dict[str, int]:
    keys = queues.redis_keys(queue)
    with connection.pipeline(transaction=False) as pipe:
        pipe.llen(keys["waiting"])
        for name in ("active", "failed", "completed", "scheduled", "deferred"):
            pipe.zcard(keys[name])
        pipe.get(fairshare.count_key(queue))
        listed, active, failed, completed, scheduled, deferred, fair = pipe.execute()
    return {
        "waiting": listed + max(int(fair or 0), 0),  # RQ's list and the tenants' lists
        "listed": listed,
        "active": active,
        "failed": failed,
        "completed": completed,
        "scheduled": scheduled,
        "deferred": deferred,
        "delayed": scheduled + deferred,
    }


def _waiting_range(connection: Redis, queue: str, start: int, stop: int, listed: int) -> list[Entry]:
    """RQ's list (RPUSHed: the newest at the tail), then the tenants' lists in serving order."""
    keys = queues.redis_keys(queue)
    ids = [_text(i) for i in reversed(connection.lrange(keys["waiting"], -stop, -start - 1))]
    if stop > listed:
        ids += fairshare.waiting_page(connection, queue, max(start - listed, 0), stop - listed)
    return [(i, None) for i in ids]


def _range(
    connection: Redis, queue: str, state: str, start: int, stop: int, sizes: dict[str, int]
) -> list[Entry]:
    """Entries at positions [start, stop) of a state, in display order.

    Newest first, except delayed jobs: the soonest due first (scheduled), then those waiting for a
    dependency (deferred)."""
    if stop <= start:
        return []
    keys = queues.redis_keys(queue)
    if state == "waiting":  # RPUSHed: the newest is at the tail; then the tenants' lists
        return _waiting_range(connection, queue, start, stop, sizes["listed"])
    if state == "delayed":
        scheduled = sizes["scheduled"]
        entries: list[Entry] = []
        if start < scheduled:
            due: list[Any] = connection.zrange(
                keys["scheduled"], start, min(stop, scheduled) - 1, withscores=True
            )
            entries += [(_text(i), float(score)) for i, score in due]
        if stop > scheduled:
            entries += [
                (_text(i), None)
                for i in connection.zrange(keys["deferred"], max(start - scheduled, 0), stop - scheduled - 1)
            ]
        return entries
    raw = connection.zrange(keys[state], start, stop - 1, desc=True)
    if state == "active":  # entries are <job id>:<execution id>
        return [(_text(i).split(":", 1)[0], None) for i in raw]
    return [(_text(i), None) for i in raw]


def _value_matches(value: Any, needle: str) -> bool:
    if isinstance(value, str):
        return needle in value.casefold()
    if isinstance(value, bool | int | float):
        return needle == json.dumps(value)
    if isinstance(value, list):
        return any(_value_matches(v, needle) for v in value)
    if isinstance(value, dict):
        return any(_value_matches(v, needle) for v in value.values())
    return False


def _payload_matches(raw: bytes | None, needle: str) -> bool:
    """Does a job's stored `data` (zlib'd JSON [func, instance, args, kwargs]) hold the value?"""
    if not raw:
        return False
    try:
        _func, _instance, args, kwargs = json.loads(zlib.decompress(raw))
    except (zlib.error, ValueError, TypeError):
        return False
    return _value_matches(args, needle) or _value_matches(kwargs, needle)


def _search(
    connection: Redis, queue: str, state: str, query: str, sizes: dict[str, int]
) -> tuple[list[Entry], int, bool]:
    """Entries of the newest SEARCH_LIMIT jobs whose id contains `query` or whose arguments hold it.

    Strings match as a substring, numbers and booleans exactly (`42` is not `142`); case-insensitive.
    Reads only each job's `data` field, SEARCH_CHUNK jobs per pipeline. Positions shift when jobs
    arrive or leave between chunks, so a job met twice is listed once."""
    needle = query.casefold()
    limit = min(sizes[state], SEARCH_LIMIT)
    matched: list[Entry] = []
    met: set[str] = set()
    for start in range(0, limit, SEARCH_CHUNK):
        entries = _range(connection, queue, state, start, min(start + SEARCH_CHUNK, limit), sizes)
        entries = [e for e in entries if e[0] not in met]
        met.update(e[0] for e in entries)
        with connection.pipeline(transaction=False) as pipe:
            for job_id, _ in entries:
                pipe.hget(_JOB + job_id, "data")
            payloads = pipe.execute()
        matched += [
            entry
            for entry, raw in zip(entries, payloads, strict=True)
            if needle in entry[0].casefold() or _payload_matches(raw, needle)
        ]
    return matched, limit, sizes[state] > SEARCH_LIMIT


def list_jobs(queue: str, state: str, *, page: int = 1, query: str = "") -> JobPage:
    """One page (PAGE_SIZE rows) of a queue's jobs in a state, optionally filtered by `query`."""
    if not is_queue(queue) or state not in STATES:
        raise ValueError(f"unknown queue or state: {queue!r}, {state!r}")
    connection = jobs.get_connection()
    sizes = _sizes(connection, queue)
    query = query.strip()
    searched, capped = 0, False
    if query:
        matched, searched, capped = _search(connection, queue, state, query, sizes)
        count = len(matched)
    else:
        count = sizes[state]
    pages = max((count + PAGE_SIZE - 1) // PAGE_SIZE, 1)
    page = min(max(page, 1), pages)
    start, stop = (page - 1) * PAGE_SIZE, page * PAGE_SIZE
    entries = matched[start:stop] if query else _range(connection, queue, state, start, stop, sizes)
    return JobPage(
        rows=_rows(connection, state, entries),
        count=count,
        page=page,
        pages=pages,
        query=query,
        searched=searched,
        capped=capped,
    )


def _summary(args: Any, kwargs: Any) -> str:
    parts = [json.dumps(a, ensure_ascii=False) for a in args or ()]
    if isinstance(kwargs, dict):
        parts += [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def _last_line(text: str | None) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _attempts_left(job: Job) -> int | None:
    """Runs still possible, the next one included; 0 for a failed job, None once it finished."""
    status = job.get_status(refresh=False)
    if status in _LIVE:
        return (job.retries_left or 0) + 1
    if status in (JobStatus.FAILED, JobStatus.STOPPED):
        return 0
    return None


def _latest_failures(connection: Redis, job_ids: list[str]) -> dict[str, str]:
    """Each job's latest failure (its exc_string), one pipeline for all of them."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.xrevrange(Result.get_key(job_id), "+", "-", count=1)
        answers = pipe.execute()
    failures = {}
    for job_id, answer in zip(job_ids, answers, strict=True):
        if answer:
            result_id, payload = answer[0]
            result = Result.restore(
                job_id, _text(result_id), payload, connection=connection, serializer=JSONSerializer
            )
            if result.type == Result.Type.FAILED:
                failures[job_id] = result.exc_string or ""
    return failures


def _rows(connection: Redis, state: str, entries: list[Entry]) -> list[JobRow]:
    ids = [job_id for job_id, _ in entries]
    found = Job.fetch_many(ids, connection=connection, serializer=JSONSerializer)
    failures = _latest_failures(connection, ids) if state == "failed" else {}
    rows = []
    for (job_id, due), job in zip(entries, found, strict=True):
        if job is None:  # its hash expired or was deleted while its id was still listed
            rows.append(JobRow(id=job_id, exists=False))
            continue
        try:
            func, arguments = job.func_name or "", _summary(job.args, job.kwargs)
        except DeserializationError:
            func, arguments = "?", ""
        rows.append(
            JobRow(
                id=job_id,
                status=_status(job),
                func=func,
                arguments=arguments,
                enqueued_at=job.enqueued_at or job.created_at,
                started_at=job.started_at,
                ended_at=job.ended_at,
                due_at=datetime.fromtimestamp(due, UTC) if due is not None else None,
                attempts_left=_attempts_left(job),
                exception=_last_line(failures.get(job_id)),
            )
        )
    return rows


# --- one job ----------------------------------------------------------------------------------
def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def job_detail(job_id: str) -> JobDetail | None:
    """Everything about one job, and the actions that apply to it now; None if it does not exist."""
    job = jobs.fetch_job(job_id)
    if job is None:
        return None
    connection = jobs.get_connection()
    status = job.get_status(refresh=False)
    keys = queues.redis_keys(job.origin)
    with connection.pipeline(transaction=False) as pipe:
        pipe.zscore(keys["scheduled"], job.id)
        pipe.zscore(keys["failed"], job.id)
        pipe.smembers(job.dependents_key)
        pipe.smembers(job.dependencies_key)
        due, failed_score, dependents, dependencies = pipe.execute()
    results = Result.all(job, serializer=JSONSerializer)  # newest first, RQ keeps the last 10
    failures = [(r.created_at, r.exc_string or "") for r in results if r.type == Result.Type.FAILED]
    success = next((r for r in results if r.type == Result.Type.SUCCESSFUL), None)
    try:
        func, args, kwargs = job.func_name or "", job.args, job.kwargs
    except DeserializationError:
        func, args, kwargs = "?", [], {}
    spec = queues.get_spec(job.origin) if is_queue(job.origin) else None
    actions = []
    if spec is not None:
        if failed_score is not None:
            actions.append("retry")
        if due is not None:
            actions.append("promote")
        if status == JobStatus.QUEUED:
            actions.append("cancel")
    if status != JobStatus.STARTED:
        actions.append("delete")
    return JobDetail(
        id=job.id,
        origin=job.origin,
        status=_status(job),
        state=STATE_OF_STATUS.get(status),
        func=func,
        description=job.description or "",
        args_json=_pretty(list(args or [])),
        kwargs_json=_pretty(kwargs),
        meta_json=_pretty(job.meta or {}),
        created_at=job.created_at,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        ended_at=job.ended_at,
        due_at=datetime.fromtimestamp(float(due), UTC) if due is not None else None,
        worker_name=job.worker_name or "",
        timeout=job.timeout,
        retries_left=job.retries_left,
        attempts_left=_attempts_left(job),
        queue_attempts=spec.attempts if spec else None,
        result_json=_pretty(success.return_value) if status == JobStatus.FINISHED and success else None,
        traceback=failures[0][1] if failures else "",
        failures=failures,
        dependents=sorted(_text(d) for d in dependents),
        dependencies=sorted(_text(d) for d in dependencies),
        actions=actions,
    )
