"""The inbox's request side: `accept` an event (one INSERT, committed with the process's other
requests' by its group commit, `write`) and wake its kind's drain without a Redis round trip per
request (a thread per process sends at most one wake-up per kind every WAKE_INTERVAL). The worker
side, `drain`: crm.inbox."""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import DatabaseError, connection, transaction

from crm import jobs, queues, recovery
from crm.inbox_kinds import _HANDLERS
from crm.models import InboxEvent

logger = logging.getLogger(__name__)

GROUP_MAX = 200  # request writes per group commit
GROUP_IDLE_CLOSE = 2.0  # seconds without writes after which the group commit closes its connection
WAKE_INTERVAL = 0.05  # seconds: a web process sends at most 20 wake-ups a second per kind
QUEUED_TTL = 60  # seconds: a queued marker whose job died frees itself
DRAIN_FUNC = "crm.inbox.drain"


# --- the request side -------------------------------------------------------------------------
TABLE = _TABLE = InboxEvent._meta.db_table  # for apps' statements that insert events themselves


@dataclass(frozen=True)
class Statement:
    """A request's durable write that the group commit runs once for every request waiting with
    it: `sql` reads the requests' rows from the relation `requests` (its `columns`, plus `n`, each
    row's position from 1) and returns at most one row per request, its first column `n`. So a
    burst of webhooks costs PostgreSQL one statement per commit, not one per request, and the
    process one execute. Build one at import time (writes are grouped by statement)."""

    sql: str
    columns: tuple[tuple[str, str], ...]  # (name, PostgreSQL type)

    @functools.cached_property
    def sql_rendered(self) -> str:
        """The statement with its `requests` relation, built once (it runs on every group commit)."""
        arrays = ", ".join(f"%s::{kind}[]" for _, kind in self.columns)
        names = ", ".join(name for name, _ in self.columns)
        requests = f"requests AS (SELECT * FROM unnest({arrays}) WITH ORDINALITY AS r({names}, n))"  # noqa: S608 - the statement's own column names
        sql = self.sql.strip()
        if sql[:5].upper() == "WITH ":
            return f"WITH {requests}, {sql[5:]}"
        return f"WITH {requests} {sql}"

    def params(self, rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
        return [list(column) for column in zip(*rows, strict=True)]


_ACCEPT = Statement(
    f"INSERT INTO {_TABLE} (kind, organization_id, payload, error) "  # noqa: S608 - table name only
    "SELECT kind, organization_id, payload, '' FROM requests ORDER BY n",
    (("kind", "text"), ("organization_id", "bigint"), ("payload", "text")),
)


def accept(*, kind: str, payload: str, organization_id: int | None = None) -> None:
    """Store one raw event durably (committed when this returns outside a transaction, with the
    process's other requests' events in one INSERT) and have it drained soon. Raises the
    database's error when it cannot be stored."""
    if kind not in _HANDLERS:
        raise ValueError(f"no inbox handler for {kind!r}")
    write(_ACCEPT, [kind, organization_id, payload])
    notify(kind)


def write(statement: Statement, row: Sequence[Any]) -> tuple[Any, ...] | None:
    """Run `statement` for one request's `row` and return its result row (without `n`; None when
    it returns none), committed when this returns: a request's durable write. Outside a
    transaction it goes through the process's group commit (the rows of concurrent requests go in
    one statement, one transaction and one commit: one WAL flush instead of one per request);
    inside one (a caller's atomic block, a test) it runs in the caller's transaction. Raises the
    database's error when the statement or its commit fails."""
    if connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(statement.sql_rendered, statement.params([row]))
            found = cursor.fetchone() if cursor.description else None
        return tuple(found[1:]) if found else None
    return _group().write(statement, row)


@dataclass
class _Write:
    statement: Statement
    row: Sequence[Any]
    result: tuple[Any, ...] | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _GroupCommit:
    """One thread per process committing the writes of every request thread waiting for it:
    whatever arrived while the previous commit was being flushed goes into the next transaction,
    one statement per kind of write. A transaction that fails on one row's data is replayed one
    request per transaction, so only that request gets the error."""

    def __init__(self) -> None:
        self.pending: list[_Write] = []
        self.ready = threading.Condition()
        self.close_asked = False
        self.closed = threading.Event()
        threading.Thread(target=self._run, name="inbox-group-commit", daemon=True).start()

    def close_connection(self, timeout: float) -> bool:
        """Have the thread close its database connection once idle; True once it has."""
        with self.ready:
            self.closed.clear()
            self.close_asked = True
            self.ready.notify()
        return self.closed.wait(timeout)

    def write(self, statement: Statement, row: Sequence[Any]) -> tuple[Any, ...] | None:
        item = _Write(statement, row)
        with self.ready:
            self.pending.append(item)
            self.ready.notify()
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.result

    def _run(self) -> None:
        while True:
            with self.ready:
                while not self.pending:
                    if self.close_asked:
                        connection.close()
                        self.close_asked = False
                        self.closed.set()
                    if not self.ready.wait(timeout=GROUP_IDLE_CLOSE):
                        connection.close()  # idle: give the connection back until writes resume
                batch, self.pending = self.pending[:GROUP_MAX], self.pending[GROUP_MAX:]
            try:
                self._commit(batch)
            finally:
                for item in batch:
                    item.done.set()

    def _commit(self, batch: list[_Write]) -> None:
        connection.close_if_unusable_or_obsolete()
        try:
            with transaction.atomic():
                _pipelined(batch)
        except DatabaseError as exc:
            if _transient(exc) or len(batch) == 1:
                if _transient(exc):
                    connection.close()  # reconnect on the next batch
                for item in batch:
                    item.result, item.error = None, exc
                return
            for item in batch:
                item.result = None
                self._commit([item])
        except BaseException as exc:  # never leave a request thread waiting
            for item in batch:
                item.result, item.error = None, exc


def _pipelined(batch: list[_Write]) -> None:
    """Run each statement of the batch once for all its requests' rows, in one round trip
    (psycopg's pipeline mode: each statement is sent without waiting for the previous one's
    result), and hand each request its result row. psycopg's errors come out as Django's, as from
    a Django cursor."""
    groups: dict[int, list[_Write]] = {}
    for item in batch:
        groups.setdefault(id(item.statement), []).append(item)
    connection.ensure_connection()
    raw = connection.connection
    with connection.wrap_database_errors:
        with raw.pipeline():
            cursors = []
            for items in groups.values():
                statement = items[0].statement
                cursor = psycopg.Cursor(raw)  # server-side binding: no quoting of the arrays in Python
                cursor.execute(statement.sql_rendered, statement.params([item.row for item in items]))
                cursors.append((cursor, items))
        for cursor, items in cursors:
            if cursor.description:
                for found in cursor.fetchall():
                    items[found[0] - 1].result = tuple(found[1:])
            cursor.close()


_group_for: tuple[int, _GroupCommit] | None = None
_group_lock = threading.Lock()


def _group() -> _GroupCommit:
    global _group_for
    with _group_lock:
        if _group_for is None or _group_for[0] != os.getpid():  # first use, or a forked child
            _group_for = (os.getpid(), _GroupCommit())
        return _group_for[1]


def group_commit_close(*, timeout: float = 60.0) -> bool:
    """Close the database connection of this process's group-commit thread now rather than after
    GROUP_IDLE_CLOSE (before a database is dropped: the end of a test session). Returns False only
    when the thread did not answer within `timeout`; True also when it never started."""
    group = _group_for
    if group is None or group[0] != os.getpid():
        return True
    return group[1].close_connection(timeout)


def notify(kind: str) -> None:
    """Have `kind` drained soon: after the current transaction commits, by this process's waker."""
    if connection.in_atomic_block:
        transaction.on_commit(lambda: _waker().owe(kind))
    else:  # on_commit would open a connection just to learn there is no transaction
        _waker().owe(kind)


class _Waker:
    """One thread per process sending coalesced wake-ups, so no request waits on Redis."""

    def __init__(self) -> None:
        self.owed: set[str] = set()
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="inbox-waker", daemon=True)
        self.thread.start()

    def owe(self, kind: str) -> None:
        with self.lock:
            self.owed.add(kind)
        self.event.set()

    def _run(self) -> None:
        while True:
            self.event.wait()
            time.sleep(WAKE_INTERVAL)  # gather the requests of the next few milliseconds
            self.send()

    def send(self) -> None:
        with self.lock:
            kinds, self.owed = self.owed, set()
            self.event.clear()
        for kind in kinds:
            try:
                wake(kind)
            except Exception:  # Redis down: the safety sweep drains what is left
                logger.warning("inbox: could not wake the %s drain", kind, exc_info=True)


_waker_for: tuple[int, _Waker] | None = None
_waker_lock = threading.Lock()


def _waker() -> _Waker:
    global _waker_for
    with _waker_lock:
        if _waker_for is None or _waker_for[0] != os.getpid():  # first use, or a forked child
            _waker_for = (os.getpid(), _Waker())
        return _waker_for[1]


def wake_owed() -> None:
    """Send this process's owed wake-ups now rather than within WAKE_INTERVAL (tests, commands)."""
    if _waker_for is not None and _waker_for[0] == os.getpid():
        _waker_for[1].send()


# One drain job per kind queued or draining (crm.jobs.Pending: its dirty flag and queued marker).
PENDING = jobs.Pending("inbox", QUEUED_TTL)


def wake(kind: str) -> bool:
    """Mark `kind` dirty and enqueue its drain job unless one is queued or draining; True if enqueued."""
    return PENDING.wake(
        kind,
        functools.partial(
            jobs.enqueue,
            DRAIN_FUNC,
            queue=queues.INBOX,
            kwargs={"kind": kind},
            result_ttl=0,
            after_commit=False,
        ),
    )


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, recovery.TRANSIENT_ERRORS)
