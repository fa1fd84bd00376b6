"""Job functions used by the tests; importable by real worker processes started from the repo root."""

from __future__ import annotations

import os
import time

from crm.jobs import Defer, enqueue, get_connection, yield_turn


def record(key: str, value: str, organization_id: int | None = None) -> str:
    """Appends `value` to the Redis list crm:test:<key>, so a test can see the job ran (and how often)."""
    get_connection().rpush(f"crm:test:{key}", value)
    return value


def fail(key: str, message: str = "boom") -> None:
    get_connection().rpush(f"crm:test:{key}", "attempt")
    raise RuntimeError(message)


def defer_once(key: str, seconds: float = 1, at_front: bool = False) -> str:
    """Defers the first time it runs, succeeds the second."""
    connection = get_connection()
    runs = connection.rpush(f"crm:test:{key}", "run")
    if runs == 1:
        raise Defer(seconds, "rate limited", at_front=at_front)
    return "done"


def sleep_and_record(key: str, seconds: float) -> None:
    """Records its pid, then sleeps: tests kill the worker in the middle."""
    get_connection().rpush(f"crm:test:{key}", str(os.getpid()))
    time.sleep(seconds)
    get_connection().rpush(f"crm:test:{key}", "finished")


def hold(key: str, timeout: float = 240) -> None:
    """Records its pid, then holds its worker until a test calls `release(key)` (`timeout` is only a
    hang guard), then records "finished": a busy worker for as long as the test needs, however slow
    the machine."""
    connection = get_connection()
    connection.rpush(f"crm:test:{key}", str(os.getpid()))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not connection.blpop([f"crm:test:{key}:release"], timeout=1):
        pass
    connection.rpush(f"crm:test:{key}", "finished")


def release(key: str) -> None:
    """Lets the job holding on `key` (see `hold`) finish; safe to call before it started."""
    get_connection().rpush(f"crm:test:{key}:release", "go")


def checkpointed(kind: str, key: str) -> str:
    from crm.checkpoints import checkpoint

    with checkpoint(kind=kind, key=key):
        get_connection().rpush(f"crm:test:{kind}", key)
    return key


def fails_first_run(key: str, message: str = "first run fails") -> str:
    """Raises RuntimeError(message) on its first run and succeeds after; every run is recorded in
    crm:test:<key> (the queue pages' retry tests)."""
    if get_connection().rpush(f"crm:test:{key}", "run") == 1:
        raise RuntimeError(message)
    return "done"


def fail_transient(key: str) -> None:
    """Fails like a dropped connection would (a transient error), recording each attempt."""
    get_connection().rpush(f"crm:test:{key}", "attempt")
    raise ConnectionError("connection reset by peer")


def chunked(key: str, chunks: int, high_queue: str = "", organization_id: int | None = None) -> None:
    """A long job in `chunks` steps that gives its turn between them (crm.jobs.yield_turn) and
    resumes where it stopped; after its first step it enqueues, on `high_queue`, a job of another
    tenant that records "high"."""
    connection = get_connection()
    for i in range(int(connection.get(f"crm:test:{key}:done") or 0), chunks):
        if i:
            yield_turn(f"chunk {i}")
        record(key, f"chunk:{i}")
        connection.set(f"crm:test:{key}:done", i + 1)
        if i == 0 and high_queue:
            enqueue(
                "tests.jobs.record", queue=high_queue, kwargs={"key": key, "value": "high"}, organization_id=2
            )
