"""A loopback SMTP server standing in for mail servers (a provider's relay, a recipient's MX), for
tests, the demo and benchmarks.

It speaks real ESMTP through aiosmtpd: EHLO, optional STARTTLS, AUTH PLAIN/LOGIN (without TLS, so
it works on plain loopback), MAIL/RCPT/DATA over as many transactions per connection as the client
wants. Accepted messages are stored parsed; connections are counted so a test can prove reuse.

Test controls (thread-safe, callable from any thread):

- ``reply_for(rcpt, 550, "5.1.1 <x@y>: Recipient address rejected: User unknown")`` - that
  recipient gets this reply at RCPT (or, with ``at="DATA"``, the whole transaction fails at the end of
  DATA), for the next ``times`` attempts (None = every attempt).
- ``reply_for_all(535, "5.7.8 Authentication credentials invalid", at="AUTH")`` - the same for every
  session, at AUTH, MAIL, RCPT or DATA. A recipient's own replies come before global ones, oldest
  first. Any 421 reply also closes the connection, as real servers do.
- ``hang_up_after_data(rcpt)`` - store that recipient's next message, then drop the connection
  without answering: the client cannot know whether it was accepted.
- ``hold()`` / ``release()`` - every DATA waits, before it is stored and answered, until released;
  ``held()`` counts the waiting ones (a test kills a sender inside a send, however slow the machine).
- ``messages(to=...)``, ``connections()``, ``messages_per_connection()``, ``wait_for_messages(n)``,
  ``reset()``.

Run it with ``python manage.py smtp_sandbox`` or in-process::

    with SmtpSandbox(require_auth=("user", "secret")) as sandbox:
        with smtplib.SMTP(*sandbox.address) as client:
            client.login("user", "secret")
            client.sendmail("from@example.com", ["to@example.com"], raw_message)
        assert sandbox.messages(to="to@example.com")
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import hmac
import itertools
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, cast, get_args

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

Stage = Literal["AUTH", "MAIL", "RCPT", "DATA"]
STAGES: tuple[Stage, ...] = get_args(Stage)
RECIPIENT_STAGES: tuple[Stage, ...] = ("RCPT", "DATA")
SERVER_HOSTNAME = "smtp-sandbox.localhost"
HOLD_LIMIT = 600.0  # seconds a held DATA waits at most, should nobody release it
HELPER_TIMEOUT = 120.0  # a hang guard only: wait_for_messages returns as soon as they are in


@dataclass
class Reply:
    """A scripted SMTP reply for one recipient (``rcpt``) or every session (``rcpt`` None)."""

    code: int
    message: str
    at: Stage
    rcpt: str | None = None
    times: int | None = None

    @property
    def status(self) -> str:
        """The reply line as sent, e.g. ``550 5.1.1 <x@y>: Recipient address rejected``."""
        return f"{self.code} {self.message}"


class _SandboxSMTP(SMTP):
    """aiosmtpd's SMTP protocol (one instance per connection) that reports to the sandbox."""

    def __init__(self, sandbox: SmtpSandbox, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sandbox = sandbox
        self.connection_id: int | None = None

    def connection_made(self, transport: Any) -> None:
        # STARTTLS calls connection_made again on the same connection: count only the first.
        if self.connection_id is None:
            self.connection_id = self.sandbox._connection_opened()
        super().connection_made(transport)

    async def push(self, status: Any) -> None:
        await super().push(status)
        line = status.encode() if isinstance(status, str) else status
        # Real servers hang up after a 421 ("service not available, closing transmission channel").
        if line.startswith(b"421") and self.transport is not None:
            self.transport.close()


class _Handler:
    """aiosmtpd hooks; they run on the server's loop and keep state in the sandbox (under its lock)."""

    def __init__(self, sandbox: SmtpSandbox) -> None:
        self.sandbox = sandbox

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, mail_options: list[str]
    ) -> str:
        # Checked here rather than with aiosmtpd's auth_required, which warns without TLS.
        if self.sandbox.require_auth is not None and not session.authenticated:
            return "530 5.7.0 Authentication required"
        reply = self.sandbox._take_reply("MAIL", [])
        if reply is not None:
            return reply.status
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 2.1.0 Ok"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, rcpt_options: list[str]
    ) -> str:
        reply = self.sandbox._take_reply("RCPT", [address])
        if reply is not None:
            return reply.status
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        await self.sandbox._wait_while_held()
        reply = self.sandbox._take_reply("DATA", envelope.rcpt_tos)
        if reply is not None:
            return reply.status
        queue_id = uuid.uuid4().hex[:12].upper()
        self.sandbox._store(
            connection_id=cast(_SandboxSMTP, server).connection_id,
            session=session,
            envelope=envelope,
            queue_id=queue_id,
        )
        if self.sandbox._take_hang_up(envelope.rcpt_tos) and server.transport is not None:
            # Accepted, but the client never hears it: its outcome is unknown to the sender.
            server.transport.close()
        return f"250 2.0.0 Ok: queued as {queue_id}"


class _SandboxController(Controller):
    """aiosmtpd's Controller serving :class:`_SandboxSMTP`, able to bind port 0."""

    def __init__(self, sandbox: SmtpSandbox, handler: _Handler, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.sandbox = sandbox

    def factory(self) -> _SandboxSMTP:
        return _SandboxSMTP(self.sandbox, self.handler, loop=self.loop, **self.SMTP_kwargs)

    def _trigger_server(self) -> None:
        # The readiness probe must connect to the port the kernel picked, not to port 0.
        server = cast(asyncio.Server, self.server)
        self.port = server.sockets[0].getsockname()[1]
        super()._trigger_server()


class SmtpSandbox:
    """An ESMTP server on loopback in a daemon thread; see the module docstring for its controls."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        require_auth: tuple[str, str] | None = None,
        starttls_context: ssl.SSLContext | None = None,
        save_dir: Path | None = None,
        keep: int | None = None,
    ) -> None:
        self.host = host
        # Long-running use (`manage.py smtp_sandbox`): write each accepted message to save_dir as
        # <queue id>.eml for a person to open, and keep only the last `keep` in memory.
        self.save_dir = save_dir
        self.keep = keep
        self.port = port
        self.require_auth = require_auth
        self.starttls_context = starttls_context
        self._controller: _SandboxController | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._connection_ids = itertools.count(1)
        self._connections = 0
        self._per_connection: dict[int, int] = {}
        self._messages: list[dict[str, Any]] = []
        self._replies: list[Reply] = []
        self._hang_ups: dict[str, int] = {}
        self._open = threading.Event()  # cleared by hold(): DATA waits until release() sets it
        self._open.set()
        self._held = 0

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` to hand to ``smtplib.SMTP(*address)``; the real port once started."""
        return self.host, self.port

    @property
    def running(self) -> bool:
        """True between start() and stop()."""
        return self._controller is not None

    def start(self) -> Self:
        """Start serving in a daemon thread; returns self once the socket answers.

        Raises OSError (e.g. the port is taken) or RuntimeError if already started.
        """
        if self._controller is not None:
            raise RuntimeError("the SMTP sandbox is already running")
        controller = _SandboxController(
            self,
            _Handler(self),
            hostname=self.host,
            port=self.port,
            # A fixed name: the default socket.getfqdn() can stall on DNS.
            server_hostname=SERVER_HOSTNAME,
            ident="SMTP sandbox",
            tls_context=self.starttls_context,
            authenticator=self._authenticate,
            # Loopback tests have no certificate; real relays would insist on TLS first.
            auth_require_tls=False,
        )
        controller.start()
        self._controller = controller
        self.port = controller.port
        # The controller's readiness probe opened a connection; it is not the test's.
        self.reset()
        return self

    def stop(self) -> None:
        """Stop serving and join the thread; a no-op when not running."""
        controller, self._controller = self._controller, None
        if controller is not None:
            controller.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # Test controls -----------------------------------------------------------------------------

    def reply_for(
        self,
        rcpt: str,
        code: int,
        message: str,
        *,
        at: Literal["RCPT", "DATA"] = "RCPT",
        times: int | None = None,
    ) -> Reply:
        """Script ``code message`` for ``rcpt`` at RCPT or DATA for ``times`` attempts (None = always)."""
        if at not in RECIPIENT_STAGES:
            raise ValueError(f"at must be one of {RECIPIENT_STAGES}, not {at!r}")
        return self._add_reply(Reply(code, message, at, _normalise(rcpt), times))

    def reply_for_all(
        self, code: int, message: str, *, at: Stage = "MAIL", times: int | None = None
    ) -> Reply:
        """Script ``code message`` for every session at ``at`` for ``times`` attempts (None = always)."""
        if at not in STAGES:
            raise ValueError(f"at must be one of {STAGES}, not {at!r}")
        return self._add_reply(Reply(code, message, at, None, times))

    def hang_up_after_data(self, rcpt: str, *, times: int = 1) -> None:
        """Accept (store) ``rcpt``'s next ``times`` messages, then drop the connection instead of
        answering 250: the client cannot know whether the message was accepted."""
        with self._lock:
            self._hang_ups[_normalise(rcpt)] = self._hang_ups.get(_normalise(rcpt), 0) + times

    def replies(self) -> list[Reply]:
        """The scripted replies still pending, oldest first."""
        with self._lock:
            return [Reply(r.code, r.message, r.at, r.rcpt, r.times) for r in self._replies]

    def messages(self, to: str | None = None) -> list[dict[str, Any]]:
        """Accepted messages in order (copies), only those addressed to ``to`` when given."""
        wanted = _normalise(to) if to is not None else None
        with self._lock:
            chosen = [
                m
                for m in self._messages
                if wanted is None or wanted in (_normalise(r) for r in m["rcpt_tos"])
            ]
        for m in chosen:
            if "message" not in m:
                _parse_into(m)
        return [{**m, "rcpt_tos": list(m["rcpt_tos"]), "headers": dict(m["headers"])} for m in chosen]

    def wait_for_messages(self, count: int, timeout: float = HELPER_TIMEOUT) -> list[dict[str, Any]]:
        """All messages once at least ``count`` were accepted; raises TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._messages) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{len(self._messages)} of {count} messages after {timeout}s")
                self._changed.wait(remaining)
        return self.messages()

    def connections(self) -> int:
        """How many SMTP connections were opened since start() or reset()."""
        with self._lock:
            return self._connections

    def messages_per_connection(self) -> dict[int, int]:
        """Accepted messages by connection id (connections with none are absent)."""
        with self._lock:
            return dict(self._per_connection)

    def hold(self) -> None:
        """Make every DATA wait (before it is stored and answered) until release()."""
        self._open.clear()

    def release(self) -> None:
        """Let the held DATA commands (and every later one) go on."""
        self._open.set()

    def held(self) -> int:
        """How many DATA commands are waiting for release()."""
        with self._lock:
            return self._held

    def reset(self) -> None:
        """Forget messages, connection counts and scripted replies."""
        with self._lock:
            self._messages.clear()
            self._replies.clear()
            self._per_connection.clear()
            self._hang_ups.clear()
            self._connections = 0

    # Called from the server's loop ----------------------------------------------------------------

    async def _wait_while_held(self) -> None:
        if self._open.is_set():
            return
        with self._lock:
            self._held += 1
        try:
            # A thread of the loop's executor waits, so the loop serves the other sessions meanwhile.
            await asyncio.get_running_loop().run_in_executor(None, self._open.wait, HOLD_LIMIT)
        finally:
            with self._lock:
                self._held -= 1

    def _add_reply(self, reply: Reply) -> Reply:
        if not 400 <= reply.code <= 599:
            raise ValueError("code must be an SMTP failure (400-599)")
        if "\r" in reply.message or "\n" in reply.message:
            raise ValueError("message must be a single line")
        if reply.times is not None and reply.times < 1:
            raise ValueError("times must be 1 or more, or None for every attempt")
        with self._lock:
            self._replies.append(reply)
        return reply

    def _take_reply(self, at: Stage, rcpts: list[str]) -> Reply | None:
        """The reply due at ``at`` for these recipients, using up one of its ``times``; None = accept."""
        wanted = {_normalise(r) for r in rcpts}
        with self._lock:
            candidates = [r for r in self._replies if r.at == at]
            # A recipient's own replies win over global ones.
            match = next((r for r in candidates if r.rcpt in wanted), None) or next(
                (r for r in candidates if r.rcpt is None), None
            )
            if match is not None and match.times is not None:
                match.times -= 1
                if match.times == 0:
                    self._replies.remove(match)
            return match

    def _take_hang_up(self, rcpts: list[str]) -> bool:
        with self._lock:
            for rcpt in (_normalise(r) for r in rcpts):
                if self._hang_ups.get(rcpt):
                    self._hang_ups[rcpt] -= 1
                    return True
        return False

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
    ) -> AuthResult:
        reply = self._take_reply("AUTH", [])
        if reply is not None:
            return AuthResult(success=False, handled=False, message=reply.status)
        if self.require_auth is None:
            # Without require_auth any login works, so clients configured with credentials still connect.
            return AuthResult(success=True, auth_data=auth_data)
        if not isinstance(auth_data, LoginPassword):
            return AuthResult(success=False, handled=False)
        user, password = self.require_auth
        ok = hmac.compare_digest(auth_data.login, user.encode()) & hmac.compare_digest(
            auth_data.password, password.encode()
        )
        # handled=False makes aiosmtpd answer "535 5.7.8 Authentication credentials invalid".
        return AuthResult(success=ok, handled=False, auth_data=auth_data)

    def _connection_opened(self) -> int:
        with self._lock:
            self._connections += 1
            return next(self._connection_ids)

    def _store(
        self, *, connection_id: int | None, session: Session, envelope: Envelope, queue_id: str
    ) -> None:
        # Parsed only when read (messages()): the reply to DATA is not held up by parsing.
        raw = envelope.original_content or b""
        login = getattr(session.auth_data, "login", None)
        record: dict[str, Any] = {
            "queue_id": queue_id,
            "connection_id": connection_id,
            "peer": session.peer,
            "auth_login": login.decode(errors="replace") if isinstance(login, bytes) else None,
            "mail_from": envelope.mail_from,
            "rcpt_tos": list(envelope.rcpt_tos),
            "raw": raw,
            "received_at": datetime.now(UTC),
        }
        if self.save_dir is not None:
            (self.save_dir / f"{queue_id}.eml").write_bytes(raw)
        with self._changed:
            self._messages.append(record)
            if self.keep is not None and len(self._messages) > self.keep:
                del self._messages[: len(self._messages) - self.keep]
            if connection_id is not None:
                self._per_connection[connection_id] = self._per_connection.get(connection_id, 0) + 1
            self._changed.notify_all()


def _parse_into(record: dict[str, Any]) -> None:
    """Add the parsed message, headers, subject, text and html to a stored record."""
    parsed = cast(EmailMessage, email.message_from_bytes(record["raw"], policy=email.policy.default))
    headers: dict[str, str] = {}
    for name, value in parsed.items():
        # A folded header starts with the folding whitespace once unfolded; clients show it trimmed.
        headers.setdefault(name, str(value).strip())
    record.update(
        headers=headers,
        subject=headers.get("Subject"),
        text=_body(parsed, "plain"),
        html=_body(parsed, "html"),
        message=parsed,  # last: its presence says the record is complete
    )


def _normalise(address: str) -> str:
    return address.strip().strip("<>").lower()


def _body(message: EmailMessage, subtype: str) -> str | None:
    """The ``text/<subtype>`` body a mail client would show, or None."""
    part = message.get_body(preferencelist=(subtype,))
    if part is None or part.get_content_subtype() != subtype:
        return None
    return cast(str, part.get_content())
