"""A sandbox standing in for Postmark's email API, for tests, the demo and benchmarks.

It answers ``POST /email`` like Postmark: the ``X-Postmark-Server-Token`` header must be one of the
server tokens (401, ErrorCode 10 otherwise), the JSON is checked as Postmark checks it (From, To,
a body), and the answers have Postmark's shapes::

    200 {"To": "...", "SubmittedAt": "...", "MessageID": "<uuid>", "ErrorCode": 0, "Message": "OK"}
    401 {"ErrorCode": 10, "Message": "Bad or missing Server API token."}
    422 {"ErrorCode": 406, "Message": "You tried to send to recipient(s) that have been marked as
         inactive. Found inactive addresses: x@y. Inactive recipients are ones that ..."}
    422 {"ErrorCode": 300, "Message": "Invalid 'To' address: 'x'."}
    422 {"ErrorCode": 400, "Message": "The 'From' address you supplied (...) is not a Sender Signature ..."}

Test controls (methods, safe from any thread): :meth:`PostmarkSandbox.deactivate` marks addresses
inactive (hard bounce / spam complaint on Postmark's side), :meth:`~PostmarkSandbox.fail` scripts
HTTP failures (503 maintenance, 500, 429...) for the next sends, :meth:`~PostmarkSandbox.set_latency`
slows every answer, :meth:`~PostmarkSandbox.requests` lists every request received (headers, JSON,
status answered), :meth:`~PostmarkSandbox.messages` the accepted ones, :meth:`~PostmarkSandbox.reset`
forgets it all.

The ``*_event`` functions build Postmark's webhook payloads (Delivery, Bounce, SpamComplaint, Open,
Click, SubscriptionChange) with the fields Postmark sends, to POST to ``/anymail/postmark/tracking/``::

    with PostmarkSandbox(server_tokens={"tok"}) as server:
        requests.post(f"{server.url}/email", headers={"X-Postmark-Server-Token": "tok"}, json={...})
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.headerregistry import Address
from email.utils import getaddresses
from typing import Any

from aiohttp import web

from project.sandboxes.server import ThreadedAppServer

logger = logging.getLogger(__name__)

TOKEN_HEADER = "X-Postmark-Server-Token"  # noqa: S105 - a header name
# Postmark's wording for the errors it answers.
BAD_TOKEN = "Bad or missing Server API token."  # noqa: S105 - an error message
INACTIVE = (
    "You tried to send to recipient(s) that have been marked as inactive. Found inactive addresses: "
    "{addresses}. Inactive recipients are ones that have generated a hard bounce, a spam complaint, "
    "or a manual suppression."
)
NOT_A_SIGNATURE = (
    "The 'From' address you supplied ({sender}) is not a Sender Signature on your account. Please add "
    "and confirm this address in order to be able to use it in the 'From' field of your messages."
)


def _json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(payload, ensure_ascii=False).encode(), status=status, content_type="application/json"
    )


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class ScriptedFailure:
    """A scripted answer for the next ``times`` sends to ``to`` ("*" = anyone; None = every send)."""

    status: int
    error_code: int | None = None
    message: str = ""
    to: str = "*"
    times: int | None = 1

    def response(self) -> web.Response:
        if self.error_code is None and not self.message:
            return web.Response(status=self.status, text=f"{self.status} sandbox: scripted failure")
        return _json_response({"ErrorCode": self.error_code or 0, "Message": self.message}, self.status)


@dataclass
class _State:
    """Everything a reset forgets; only ever touched on the server's event loop."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    failures: list[ScriptedFailure] = field(default_factory=list)
    inactive: set[str] = field(default_factory=set)


class PostmarkSandbox(ThreadedAppServer):
    """Postmark's ``POST /email`` as an aiohttp app on its own event loop in a daemon thread.

    ``server_tokens``: the accepted server API tokens. ``sender_signatures``: the From addresses the
    account may use (None: any).
    """

    thread_name = "postmark-sandbox"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        server_tokens: Iterable[str] = (),
        sender_signatures: Iterable[str] | None = None,
        latency_ms: float = 0.0,
    ) -> None:
        super().__init__(host, port)
        self._tokens = frozenset(server_tokens)
        self._signatures = None if sender_signatures is None else {s.lower() for s in sender_signatures}
        self._latency_ms = float(latency_ms)
        self._state = _State()

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=10 * 1024 * 1024)  # Postmark's 10 MB per message
        app.router.add_post("/email", self._handle_email)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown)
        return app

    # -- thread-safe controls -------------------------------------------------------------------

    def deactivate(self, *addresses: str) -> None:
        """Mark addresses inactive: sends to them are refused with ErrorCode 406, as Postmark does."""
        self._on_loop(lambda: self._state.inactive.update(a.lower() for a in addresses))

    def fail(
        self,
        status: int,
        error_code: int | None = None,
        message: str = "",
        *,
        to: str = "*",
        times: int | None = 1,
    ) -> None:
        """Answer the next ``times`` sends to ``to`` (None: every send) with this status and body;
        without ``error_code`` and ``message`` the body is plain text (a proxy's 503)."""
        if not 400 <= status <= 599:
            raise ValueError("status must be an HTTP error status (400-599)")
        rule = ScriptedFailure(status, error_code, message, to.lower(), times)
        self._on_loop(lambda: self._state.failures.append(rule))

    def set_latency(self, ms: float) -> None:
        """Delay every answer by ``ms`` milliseconds (to make a client time out); answers already
        waiting re-read it, so a long latency holds them until a shorter one releases them."""
        self._latency_ms = max(float(ms), 0.0)

    def requests(self) -> list[dict[str, Any]]:
        """Every ``POST /email`` in order: headers, token, json (None if unparsable), status answered,
        received_at."""
        return self._on_loop(lambda: [dict(r) for r in self._state.requests])

    def messages(self, to: str | None = None) -> list[dict[str, Any]]:
        """Accepted messages in order (the JSON as received, plus MessageID and SubmittedAt)."""
        wanted = to.lower() if to else None
        return self._on_loop(
            lambda: [dict(m) for m in self._state.messages if wanted is None or wanted in m["_to"]]
        )

    def reset(self) -> None:
        """Forget requests, messages, scripted failures and inactive addresses."""

        def clear() -> None:
            self._state = _State()

        self._on_loop(clear)

    # -- request handling (event loop only) -----------------------------------------------------

    async def _handle_email(self, request: web.Request) -> web.Response:
        body = await request.read()
        token = request.headers.get(TOKEN_HEADER, "")
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        entry: dict[str, Any] = {
            "headers": dict(request.headers),
            "token": token,
            "json": data,
            "status": None,
            "received_at": datetime.now(UTC),
        }
        self._state.requests.append(entry)
        response = self._answer(token, data)  # decided (a message stored) before any latency
        entry["status"] = response.status
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        # Re-read while waiting: a test holds an answer with a long latency and releases it with 0.
        while (remaining := arrived + self._latency_ms / 1000 - loop.time()) > 0:
            await asyncio.sleep(min(remaining, 0.05))
        return response

    def _answer(self, token: str, data: Any) -> web.Response:
        """Postmark's answer to one send: a scripted failure, a refusal, or the message accepted."""
        recipients, bad_recipient = _addresses(data.get("To", "")) if isinstance(data, dict) else ([], None)
        scripted = self._scripted_failure(recipients)
        if scripted is not None:
            return scripted
        if token not in self._tokens:
            return _json_response({"ErrorCode": 10, "Message": BAD_TOKEN}, 401)
        if not isinstance(data, dict):
            return _json_response({"ErrorCode": 402, "Message": "Received invalid JSON input."}, 422)
        refusal = self._refusal(data, recipients, bad_recipient)
        if refusal is not None:
            return _json_response(refusal, 422)
        message_id, submitted = str(uuid.uuid4()), _now()
        self._state.messages.append(
            {**data, "MessageID": message_id, "SubmittedAt": submitted, "_to": recipients}
        )
        return _json_response(
            {
                "To": data["To"],
                "SubmittedAt": submitted,
                "MessageID": message_id,
                "ErrorCode": 0,
                "Message": "OK",
            }
        )

    def _scripted_failure(self, recipients: list[str]) -> web.Response | None:
        """The first scripted failure for these recipients (spending one of its times), or None."""
        failures = self._state.failures
        for rule in failures:
            if rule.to == "*" or rule.to in recipients:
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times <= 0:
                        failures.remove(rule)
                return rule.response()
        return None

    def _refusal(
        self, data: dict[str, Any], recipients: list[str], bad_recipient: str | None
    ) -> dict[str, Any] | None:
        """The error Postmark answers (422) for a message it refuses, or None."""
        sender, bad_sender = _addresses(data.get("From", ""))
        if not sender or bad_sender is not None:
            return {"ErrorCode": 300, "Message": f"Invalid 'From' address: '{data.get('From', '')}'."}
        if self._signatures is not None and sender[0] not in self._signatures:
            return {"ErrorCode": 400, "Message": NOT_A_SIGNATURE.format(sender=sender[0])}
        if bad_recipient is not None:
            return {"ErrorCode": 300, "Message": f"Invalid 'To' address: '{bad_recipient}'."}
        if not recipients:
            return {"ErrorCode": 300, "Message": "Zero recipients specified"}
        if not data.get("TextBody") and not data.get("HtmlBody"):
            return {"ErrorCode": 300, "Message": "Provide either email TextBody or HtmlBody or both."}
        inactive = [a for a in recipients if a in self._state.inactive]
        if inactive and len(inactive) == len(recipients):
            return {"ErrorCode": 406, "Message": INACTIVE.format(addresses=", ".join(inactive))}
        return None

    async def _handle_unknown(self, request: web.Request) -> web.Response:
        return _json_response(
            {"ErrorCode": 404, "Message": f"Not found: {request.method} {request.path}"}, 404
        )


def _addresses(value: str) -> tuple[list[str], str | None]:
    """(the addr-specs of a header value, lower-cased; the first one that is not an address, or None)."""
    found: list[str] = []
    for _name, addr in getaddresses([str(value)]):
        local, _, domain = addr.rpartition("@")
        try:
            Address(addr_spec=addr)
        except (ValueError, IndexError):
            return found, addr
        if not local or "." not in domain.strip("."):
            return found, addr
        found.append(addr.lower())
    return found, None


# -- Postmark's webhook payloads ----------------------------------------------------------------


def delivery_event(*, message_id: str, recipient: str, stream: str = "outbound") -> dict[str, Any]:
    return {
        "RecordType": "Delivery",
        "ServerID": 23,
        "MessageStream": stream,
        "MessageID": message_id,
        "Recipient": recipient,
        "Tag": "",
        "DeliveredAt": _now(),
        "Details": "smtp;250 2.0.0 OK",
        "Metadata": {},
    }


def bounce_event(
    *,
    message_id: str,
    recipient: str,
    kind: str = "HardBounce",  # Postmark's "Type": HardBounce, SoftBounce, Transient, DnsError...
    type_code: int = 1,
    description: str = "The server was unable to deliver your message (ex: unknown user, mailbox not found).",
    details: str = "smtp;550 5.1.1 The email account that you tried to reach does not exist.",
    bounce_id: int = 4323372036854775807,
    stream: str = "outbound",
) -> dict[str, Any]:
    names = {"HardBounce": "Hard bounce", "SoftBounce": "Soft bounce", "Transient": "Message delayed"}
    return {
        "RecordType": "Bounce",
        "MessageStream": stream,
        "ID": bounce_id,
        "Type": kind,
        "TypeCode": type_code,
        "Name": names.get(kind, kind),
        "Tag": "",
        "MessageID": message_id,
        "Metadata": {},
        "ServerID": 23,
        "Description": description,
        "Details": details,
        "Email": recipient,
        "From": "sender@example.com",
        "BouncedAt": _now(),
        "DumpAvailable": True,
        "Inactive": kind == "HardBounce",
        "CanActivate": True,
        "Subject": "",
        "Content": "",
    }


def spam_complaint_event(*, message_id: str, recipient: str, complaint_id: int = 42) -> dict[str, Any]:
    return {
        "RecordType": "SpamComplaint",
        "MessageStream": "outbound",
        "ID": complaint_id,
        "Type": "SpamComplaint",
        "TypeCode": 512,
        "Name": "Spam complaint",
        "Tag": "",
        "MessageID": message_id,
        "Metadata": {},
        "ServerID": 23,
        "Description": "The subscriber explicitly marked this message as spam.",
        "Details": "Spam complaint",
        "Email": recipient,
        "From": "sender@example.com",
        "BouncedAt": _now(),
        "DumpAvailable": True,
        "Inactive": True,
        "CanActivate": False,
        "Subject": "",
        "Content": "",
    }


_CLIENT = {
    "UserAgent": "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/120.0 Safari/537.36",
    "OS": {"Name": "Windows 10", "Family": "Windows", "Company": "Microsoft Corporation"},
    "Client": {"Name": "Chrome 120.0", "Family": "Chrome", "Company": "Google"},
    "Geo": {"CountryISOCode": "BR", "Country": "Brazil", "RegionISOCode": "SP", "Region": "Sao Paulo"},
}


def open_event(*, message_id: str, recipient: str, first_open: bool = True) -> dict[str, Any]:
    return {
        "RecordType": "Open",
        "MessageStream": "outbound",
        "Metadata": {},
        "FirstOpen": first_open,
        "Recipient": recipient,
        "MessageID": message_id,
        "ReceivedAt": _now(),
        "Platform": "WebMail",
        "ReadSeconds": 5,
        "Tag": "",
        **_CLIENT,
    }


def click_event(*, message_id: str, recipient: str, original_link: str) -> dict[str, Any]:
    return {
        "RecordType": "Click",
        "MessageStream": "outbound",
        "Metadata": {},
        "Recipient": recipient,
        "MessageID": message_id,
        "ReceivedAt": _now(),
        "Platform": "Desktop",
        "ClickLocation": "HTML",
        "OriginalLink": original_link,
        "Tag": "",
        **_CLIENT,
    }


def subscription_change_event(
    *,
    message_id: str,
    recipient: str,
    suppress: bool = True,
    reason: str = "ManualSuppression",
    origin: str = "Recipient",
) -> dict[str, Any]:
    return {
        "RecordType": "SubscriptionChange",
        "MessageID": message_id,
        "ServerID": 23,
        "MessageStream": "outbound",
        "ChangedAt": _now(),
        "Recipient": recipient,
        "Origin": origin,
        "SuppressSending": suppress,
        "SuppressionReason": reason if suppress else None,
        "Tag": "",
        "Metadata": {},
    }
