"""Sending over an organization's SMTP server: plain values in, the server's answers out.

Timeouts as the seed sets them (connection and greeting 15 s, then 30 s per socket operation),
and one connection reused for many messages (`SmtpConnection`, a context manager).
"""

from __future__ import annotations

import re
import smtplib
import socket
import ssl
import time
from dataclasses import dataclass
from email import policy
from email.message import EmailMessage
from types import TracebackType
from typing import Self

from django.utils.translation import gettext as _

from integrations import outbound

_DOT_AT_LINE_START = re.compile(rb"(?m)^\.")
# SMTP's own line limit (RFC 5322: 998). At policy.SMTP's 78, a header with a long unbreakable
# token — the signed one-click URL in List-Unsubscribe — would be turned into RFC 2047 encoded
# words, which mail clients do not read as a URL.
WIRE_POLICY = policy.SMTP.clone(max_line_length=998)
CONNECT_TIMEOUT = 15.0  # TCP connect and the server's 220 greeting
SOCKET_TIMEOUT = 30.0  # every later read or write
TEST_CONNECT_TIMEOUT = 5.0  # the admin's test email: a web request waits for it


@dataclass(frozen=True)
class SmtpServer:
    host: str
    port: int
    security: str  # "starttls" | "tls" | "none"
    username: str = ""
    password: str = ""  # decrypted by the caller just before use; never in a job payload or log

    def __repr__(self) -> str:  # keep the password out of tracebacks and logs
        return f"SmtpServer({self.host}:{self.port}, {self.security}, user={self.username!r})"


class OutcomeUnknown(Exception):
    """The connection broke after the message was handed over (after DATA's 354): the server may
    or may not have accepted it, so it must not be sent again."""


class SmtpUnreachable(smtplib.SMTPConnectError):
    """No SMTP session could be opened with the server (refused, timed out, no greeting or not an
    SMTP server's): the same error whatever the reason."""

    def __init__(self, host: str, port: int) -> None:
        text = _("Could not open an SMTP session with %(host)s:%(port)s.") % {"host": host, "port": port}
        super().__init__(421, text)


class SmtpHostRefused(smtplib.SMTPConnectError):
    """The outbound guard refused the SMTP host (a private, loopback or reserved address)."""


class GuardedSMTP(smtplib.SMTP):
    """smtplib's client, its socket connected through integrations.outbound (the address actually
    connected to is checked: names in any notation, every resolved address)."""

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return outbound.create_connection((host, port), timeout, self.source_address)  # type: ignore[arg-type]


class GuardedSMTPSSL(smtplib.SMTP_SSL):
    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        sock = outbound.create_connection((host, port), timeout, self.source_address)  # type: ignore[arg-type]
        return self.context.wrap_socket(sock, server_hostname=self._host)  # type: ignore[attr-defined]


def _reply(code: int, message: bytes | str) -> str:
    text = message.decode(errors="replace") if isinstance(message, bytes) else message
    return f"{code} {text}".strip()


class SmtpConnection:
    """One (authenticated) SMTP session: `send` many messages over it, then close."""

    def __init__(self, server: SmtpServer, *, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.server = server
        self.connect_timeout = connect_timeout
        self.client: smtplib.SMTP | None = None
        self.login_reply = ""
        self.last_used = 0.0  # time.monotonic() of the last command
        self.sent = 0

    def open(self) -> Self:
        """Connect, greet, STARTTLS/TLS as configured and log in; raises smtplib/ssl/OSError errors."""
        s = self.server
        context = ssl.create_default_context()
        try:
            if s.security == "tls":
                client: smtplib.SMTP = GuardedSMTPSSL(
                    s.host, s.port, timeout=self.connect_timeout, context=context
                )
            else:
                client = GuardedSMTP(s.host, s.port, timeout=self.connect_timeout)
        except outbound.OutboundURLError as exc:
            raise SmtpHostRefused(421, str(exc)) from None
        except (smtplib.SMTPException, OSError) as exc:
            # Refused, timed out, no or a foreign greeting: one answer, so the settings page is no
            # port scanner (the guard already keeps it off the platform's own network).
            raise SmtpUnreachable(s.host, s.port) from exc
        try:
            if client.sock is not None:
                client.sock.settimeout(SOCKET_TIMEOUT)
            client.ehlo()
            if s.security == "starttls":
                client.starttls(context=context)
                client.ehlo()
            if s.username:
                code, msg = client.login(s.username, s.password)
                self.login_reply = _reply(code, msg)
        except BaseException:
            client.close()
            raise
        self.client = client
        self.last_used = time.monotonic()
        return self

    @property
    def is_open(self) -> bool:
        return self.client is not None

    def alive(self) -> bool:
        """NOOP the server: False (and closed) when the connection is gone."""
        if self.client is None:
            return False
        try:
            code, _ = self.client.noop()
        except (smtplib.SMTPException, OSError):
            code = 0
        if code != 250:
            self.close()
            return False
        self.last_used = time.monotonic()
        return True

    def send(self, message: EmailMessage) -> str:
        """Send one message; returns the server's answer to DATA verbatim ("250 2.0.0 Ok: queued as …").

        Raises smtplib's errors with the server's code and text (SMTPSenderRefused,
        SMTPRecipientsRefused, SMTPDataError, SMTPServerDisconnected); the session stays usable
        after a refused message (RSET), as smtplib's sendmail does.
        """
        assert self.client is not None, "open() first"
        client = self.client
        sender = message["Sender"] or message["From"]
        from_addr = message["From"].addresses[0].addr_spec if message["From"] else str(sender)
        recipients = [
            a.addr_spec
            for field in ("To", "Cc", "Bcc")
            for a in (message[field].addresses if message[field] else ())
        ]
        code, resp = client.mail(from_addr)
        if code != 250:
            self._reset(code)
            raise smtplib.SMTPSenderRefused(code, resp, from_addr)
        refused = {}
        for rcpt in recipients:
            rcode, rresp = client.rcpt(rcpt)
            if rcode not in (250, 251):
                refused[rcpt] = (rcode, rresp)
            if rcode == 421:
                break
        if len(refused) == len(recipients):
            self._reset(next(iter(refused.values()))[0])
            raise smtplib.SMTPRecipientsRefused(refused)
        del message["Bcc"]
        code, resp = self._data(message.as_bytes(policy=WIRE_POLICY))
        self.last_used = time.monotonic()
        if code != 250:
            self._reset(code)
            raise smtplib.SMTPDataError(code, resp)
        self.sent += 1
        return _reply(code, resp)

    def _data(self, payload: bytes) -> tuple[int, bytes]:
        """smtplib's data(), split so a failure after the hand-over is told apart (OutcomeUnknown)."""
        assert self.client is not None
        client = self.client
        client.putcmd("data")
        code, repl = client.getreply()
        if code != 354:
            self._reset(code)
            raise smtplib.SMTPDataError(code, repl)
        body = _DOT_AT_LINE_START.sub(b"..", payload)
        if not body.endswith(b"\r\n"):
            body += b"\r\n"
        try:
            client.send(body + b".\r\n")
            return client.getreply()
        except (smtplib.SMTPServerDisconnected, OSError) as exc:
            self.client = None
            client.close()
            raise OutcomeUnknown(f"{type(exc).__name__}: {exc}") from exc

    def _reset(self, code: int) -> None:
        assert self.client is not None
        if code == 421:
            self.client.close()  # the server is closing the channel
            self.client = None
            return
        try:
            self.client.rset()
        except smtplib.SMTPServerDisconnected:
            self.client = None

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client.quit()
            except (smtplib.SMTPException, OSError):
                self.client.close()
            self.client = None

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def send_test_email(server: SmtpServer, *, sender: str, to: str) -> str:
    """Send a short test email; returns every answer of the server verbatim, or raises."""
    message = EmailMessage()
    message["From"], message["To"] = sender, to
    message["Subject"] = "Teste de envio — CRM"
    message.set_content(
        "Se você recebeu esta mensagem, o envio de e-mails da sua organização está funcionando."
    )
    with SmtpConnection(server, connect_timeout=TEST_CONNECT_TIMEOUT) as connection:
        answer = connection.send(message)
        return f"{connection.login_reply}\n{answer}".strip()
