"""SMTP connections kept open per worker process and reused across messages and jobs.

One connection per server (host, port, security, user and a digest of the password, so changed
settings open a new one). A connection idle for a while is checked with NOOP before reuse; a
server that hung up between two messages is reconnected once, transparently, because nothing of
the next message was handed over yet.
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

_lock = threading.Lock()
_connections: dict[tuple[str, int, str, str, str], SmtpConnection] = {}
opened = 0  # connections opened by this process (the benchmark reports it)


def _key(server: SmtpServer) -> tuple[str, int, str, str, str]:
    digest = hashlib.sha256(server.password.encode()).hexdigest()[:16]
    return (server.host, server.port, server.security, server.username, digest)


def _open(server: SmtpServer) -> SmtpConnection:
    global opened
    connection = SmtpConnection(server).open()
    opened += 1
    return connection


def connection(server: SmtpServer, *, idle_check: float = 15.0) -> SmtpConnection:
    """An open connection to `server`, reused when this process has one; raises what open() raises."""
    key = _key(server)
    with _lock:
        current = _connections.pop(key, None)
    fresh_enough = current is not None and time.monotonic() - current.last_used < idle_check
    if current is not None and current.is_open and (fresh_enough or current.alive()):
        with _lock:
            _connections[key] = current
        return current
    fresh = _open(server)
    with _lock:
        _connections[key] = fresh
    return fresh


def send(server: SmtpServer, build: Callable[[], EmailMessage], *, idle_check: float = 15.0) -> str:
    """Send `build()` (an EmailMessage) over the pooled connection; reconnects once when the server
    had closed it before anything of this message was handed over. Returns the server's answer."""
    conn = connection(server, idle_check=idle_check)
    try:
        return conn.send(build())
    except smtplib.SMTPServerDisconnected:
        # Raised at MAIL/RCPT/DATA-command time: the message was not handed over (OutcomeUnknown
        # covers a break after it), so a second try on a new connection cannot duplicate it.
        discard(server)
        return connection(server, idle_check=idle_check).send(build())


def discard(server: SmtpServer) -> None:
    """Close and forget the connection to `server` (after an error that may have left it unusable)."""
    with _lock:
        current = _connections.pop(_key(server), None)
    if current is not None:
        current.close()


@atexit.register
def close_all() -> None:
    with _lock:
        items = list(_connections.values())
        _connections.clear()
    for item in items:
        item.close()
