"""Meta WhatsApp Cloud API (Graph) client: plain values in, plain values out.

Async, so one worker process keeps many sends in flight: a slow Graph API must not cap the
rate at workers / latency.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import quote

from integrations import http_pool, retry
from integrations.errors import IntegrationError
from integrations.outbound import OutboundURLError
from integrations.whatsapp.errors import Action, classify
from integrations.whatsapp.parameters import template_text


@dataclass(frozen=True)
class UrlButton:
    index: int
    text: str  # the dynamic suffix of the template's URL (e.g. "r/<token>")


@dataclass(frozen=True)
class TemplateMessage:
    to: str  # digits, country code first, no "+"
    template: str
    language: str
    body: list[str] = field(default_factory=list)
    header_image_url: str = ""
    buttons: list[UrlButton] = field(default_factory=list)
    biz_opaque_callback_data: str = ""


@dataclass(frozen=True)
class SendResult:
    wamid: str = ""
    wa_id: str = ""
    error: IntegrationError | None = None
    action: Action | None = None
    # The request may have reached Meta (it timed out or the connection broke after it was sent):
    # Meta may have accepted it and may still report it.
    maybe_accepted: bool = False
    # Seconds Meta asked to wait before another try (its Retry-After, bounded), when it said.
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def build_payload(message: TemplateMessage) -> dict:
    """The Graph API JSON body of a template message; body texts as Meta takes them (`template_text`)."""
    components: list[dict] = []
    if message.header_image_url:
        components.append(
            {"type": "header", "parameters": [{"type": "image", "image": {"link": message.header_image_url}}]}
        )
    if message.body:
        components.append(
            {"type": "body", "parameters": [{"type": "text", "text": template_text(v)} for v in message.body]}
        )
    for button in message.buttons:
        components.append(
            {
                "type": "button",
                "sub_type": "url",
                "index": str(button.index),
                "parameters": [{"type": "text", "text": button.text}],
            }
        )
    payload: dict = {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": message.to,
        "type": "template",
        "template": {
            "name": message.template,
            "language": {"code": message.language},
            "components": components,
        },
    }
    if message.biz_opaque_callback_data:
        payload["biz_opaque_callback_data"] = message.biz_opaque_callback_data
    return payload


def text_payload(*, to: str, text: str, context_wamid: str = "") -> dict:
    """The Graph API JSON body of a free-form text message (allowed inside the 24-hour window only)."""
    payload: dict = {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "text",
        "text": {"body": text[:4096], "preview_url": False},
    }
    if context_wamid:
        payload["context"] = {"message_id": context_wamid}
    return payload


def _error_from(status: int, data: object, retry_after: float | None = None) -> IntegrationError:
    # Whatever came back: a body that is not Graph's error shape (a proxy's or a load balancer's
    # answer) is an error without a code.
    body = data.get("error") if isinstance(data, dict) else None
    if not isinstance(body, dict):
        body = {}
    raw_code = body.get("code")
    code = raw_code if isinstance(raw_code, int) and not isinstance(raw_code, bool) else None
    error_data = body.get("error_data")
    details = error_data.get("details", "") if isinstance(error_data, dict) else ""
    action = classify(code=code, status=status)
    return IntegrationError(
        str(body.get("message") or f"HTTP {status}"),
        code=code,
        status=status,
        details=str(details),
        retryable=action in (Action.RETRY, Action.THROTTLED),
        retry_after=retry_after,
    )


def _json(body: bytes) -> object:
    """The answer's JSON, or None when it is not JSON (nested too deep to parse included)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


MAX_WAMID, MAX_WA_ID = 128, 20  # the message row's columns


def _accepted(data: object) -> tuple[str, str] | None:
    """(wamid, wa_id) of a send Meta accepted, or None when the answer names no message id a row
    can keep (missing, not text, empty, too long, a control character). A wa_id that cannot be kept
    is left out: the message is Meta's either way."""
    try:
        wamid = data["messages"][0]["id"]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(wamid, str) or not 0 < len(wamid) <= MAX_WAMID or not wamid.isprintable():
        return None
    try:
        wa_id = (data.get("contacts") or [{}])[0].get("wa_id", "")  # type: ignore[attr-defined]
    except (KeyError, IndexError, TypeError, AttributeError):
        wa_id = ""
    if not isinstance(wa_id, str) or len(wa_id) > MAX_WA_ID or not wa_id.isprintable():
        wa_id = ""
    return wamid, wa_id


def _no_answer(exc: http_pool.PoolError) -> SendResult:
    """A send that got no answer, as integrations.retry classifies it: a send is not idempotent
    (the Graph API takes no idempotency key), so one that went out is `maybe_accepted`."""
    decision = retry.for_transport(retry.pool_transport(exc), idempotent=False)
    message = f"timeout: {exc}" if isinstance(exc, http_pool.AnswerTimeout) else f"connection error: {exc}"
    # A URL that can never work is retried as before (attempts are spent, then it fails): the URL
    # is the deployment's and the phone number id's, not the recipient's.
    return SendResult(
        error=IntegrationError(
            message, retryable=True, maybe_delivered=decision.verdict is retry.Verdict.MAYBE_DELIVERED
        ),
        action=Action.RETRY,
        maybe_accepted=decision.verdict is retry.Verdict.MAYBE_DELIVERED,
    )


class GraphClient:
    """Sends over `pool` (integrations.http.post_pool of the Graph base URL, on one event loop);
    with none, every send stops its number with `refused` (a base URL that cannot be posted to)."""

    def __init__(self, *, pool: http_pool.PostPool | None, version: str, refused: str = "") -> None:
        self.pool = pool
        self.version = version
        self.refused = refused
        self._paths: dict[str, str] = {}

    def _messages_path(self, phone_number_id: str) -> str:
        """The number's messages endpoint under the pool's base URL. Its id is an operator's text:
        one quoted path segment whatever it holds ("?", "/", "..": never another Graph endpoint);
        ValueError when it cannot be encoded (a lone surrogate)."""
        path = self._paths.get(phone_number_id)
        if path is None:
            segments = (self.version, phone_number_id, "messages")
            path = "/" + "/".join(quote(s, safe="") for s in segments)
            if len(self._paths) < 1024:  # a process sends from a few numbers
                self._paths[phone_number_id] = path
        return path

    async def send_template(
        self, *, phone_number_id: str, access_token: str, message: TemplateMessage
    ) -> SendResult:
        """POST /{version}/{phone-number-id}/messages. Never raises for a provider error: the
        result carries the error and what to do about it."""
        return await self.send_payload(
            phone_number_id=phone_number_id, access_token=access_token, payload=build_payload(message)
        )

    async def send_text(self, *, phone_number_id: str, access_token: str, to: str, text: str) -> SendResult:
        """A free-form text message (Meta refuses it outside the 24-hour window: 131047)."""
        return await self.send_payload(
            phone_number_id=phone_number_id, access_token=access_token, payload=text_payload(to=to, text=text)
        )

    async def send_payload(self, *, phone_number_id: str, access_token: str, payload: dict) -> SendResult:
        """POST one message body as it is; the result as `send_template` describes it."""
        # ASCII JSON (\u escapes, as Meta reads them): any text travels, a lone surrogate included.
        body = json.dumps(payload, separators=(",", ":")).encode("ascii")
        if self.pool is None:
            error = IntegrationError(f"request not sent: {self.refused}", retryable=False)
            return SendResult(error=error, action=Action.PAUSE_NUMBER)
        try:
            answer = await self.pool.post(
                self._messages_path(phone_number_id),
                body,
                {"Content-Type": "application/json", "Authorization": f"Bearer {access_token}"},
            )
        except http_pool.PoolError as exc:
            return _no_answer(exc)
        except OutboundURLError as exc:
            # The outbound guard refused the Graph URL's address before anything was sent: the
            # number's URL (or the deployment's) must change, whoever the recipient. Its sends stop.
            return SendResult(error=IntegrationError(str(exc), retryable=False), action=Action.PAUSE_NUMBER)
        except ValueError as exc:
            # A token that cannot travel in a header (a line break, a control character) or an id
            # that cannot be encoded (a lone surrogate): nothing was sent, and no recipient would
            # fare better. The number's sends stop.
            error = IntegrationError(f"request not sent: {exc}", retryable=False)
            return SendResult(error=error, action=Action.PAUSE_NUMBER)
        status = answer.status
        if 300 <= status < 400:
            # A Graph URL that answers elsewhere is wrong for every recipient: its sends stop. The
            # redirect is never followed.
            error = IntegrationError(f"HTTP {status}: redirect not followed", retryable=False, status=status)
            return SendResult(error=error, action=Action.PAUSE_NUMBER)
        data = _json(answer.body)
        if status == 200:
            accepted = _accepted(data)
            if accepted is None:
                error = IntegrationError("malformed success response", retryable=False, status=200)
                return SendResult(error=error, action=Action.DROP_RECIPIENT)
            return SendResult(wamid=accepted[0], wa_id=accepted[1])
        delay = retry.for_status(status, retry_after_header=answer.headers.get("retry-after")).delay
        error = _error_from(status, data, delay)
        return SendResult(error=error, action=classify(code=error.code, status=status), retry_after=delay)
