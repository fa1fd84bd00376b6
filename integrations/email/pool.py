"""SMTP connections kept open per worker process and reused across messages and jobs.

Per server (host, port, security, user and a digest of the password, so changed settings open new
ones) a process keeps up to EMAIL_CONNECTIONS sessions: a send checks one out, uses it and puts it
back. A connection idle for a while is checked with NOOP before reuse; a server that hung up
between two messages is reconnected once, transparently, because nothing of the next message was
handed over yet.
"""

from __future__ import annotations

import atexit
import hashlib
import smtplib
import threading
import time
from collections.abc import Callable
from email.message import EmailMessage

from integrations.email.smtp import SmtpConnection, SmtpServer

Key = tuple[str, int, str, str, str]

_lock = threading.Lock()
_idle: dict[Key, list[SmtpConnection]] = {}
opened = 0  # connections opened by this process (the benchmark reports it)


def _key(server: SmtpServer) -> Key:
    digest = hashlib.sha256(server.password.encode()).hexdigest()[:16]
    return (server.host, server.port, server.security, server.username, digest)


def _open(server: SmtpServer) -> SmtpConnection:
    global opened
    connection = SmtpConnection(server).open()
    with _lock:
        opened += 1
    return connection


def checkout(server: SmtpServer, *, idle_check: float = 15.0) -> SmtpConnection:
    """An open connection to `server` for this thread's exclusive use until `checkin`: an idle one
    of this process when there is one (NOOP-checked when idle for `idle_check` s), else a new one.
    Raises what opening raises (smtplib, ssl and socket errors)."""
    key = _key(server)
    while True:
        with _lock:
            current = _idle.get(key, []).pop() if _idle.get(key) else None
        if current is None:
            return _open(server)
        if current.is_open and (time.monotonic() - current.last_used < idle_check or current.alive()):
            return current
        current.close()


def checkin(server: SmtpServer, connection: SmtpConnection) -> None:
    """Give a connection back for reuse (closed ones are dropped)."""
    if not connection.is_open:
        return
    with _lock:
        _idle.setdefault(_key(server), []).append(connection)


def connection(server: SmtpServer, *, idle_check: float = 15.0) -> SmtpConnection:
    """Check a connection out and straight back in: the one the next send will use."""
    conn = checkout(server, idle_check=idle_check)
    checkin(server, conn)
    return conn


def send(
    server: SmtpServer,
    build: Callable[[], EmailMessage],
    *,
    idle_check: float = 15.0,
    ready: Callable[[], bool] | None = None,
) -> str | None:
    """Send `build()` over a pooled connection; reconnects once when the server had closed it before
    anything of this message was handed over. Returns the server's answer. Thread-safe: each call
    has a connection of its own while it sends.

    `ready` is called once the connection is open and checked, right before the hand-over (a rate
    limiter waits for its slot there, so connecting and logging in never eat into the schedule);
    when it answers False nothing is sent and None is returned."""
    conn = checkout(server, idle_check=idle_check)
    try:
        if ready is not None and not ready():
            return None
        try:
            return conn.send(build())
        except smtplib.SMTPServerDisconnected:
            # Raised at MAIL/RCPT/DATA-command time: the message was not handed over (OutcomeUnknown
            # covers a break after it), so a second try on a new connection cannot duplicate it.
            conn.close()
            conn = _open(server)
            return conn.send(build())
    finally:
        # After a refusal the session was reset and stays usable; a broken one is closed by now.
        checkin(server, conn)


def discard(server: SmtpServer) -> None:
    """Close and forget the idle connections to `server` (after the server refused the account)."""
    with _lock:
        idle = _idle.pop(_key(server), [])
    for item in idle:
        item.close()


@atexit.register
def close_all() -> None:
    with _lock:
        items = [c for conns in _idle.values() for c in conns]
        _idle.clear()
    for item in items:
        item.close()
