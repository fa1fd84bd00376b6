"""A sandbox standing in for Meta's WhatsApp Cloud API (Graph API), for tests, the demo and benchmarks.

It answers ``POST /{version}/{phone_number_id}/messages`` like Graph does: the same token check, the
same validation of template messages and the same JSON shapes for success and for errors. Accepted
sends are recorded, and, when a webhook URL and an app secret are configured, ``sent``, ``delivered``
and ``read`` status callbacks are POSTed to the webhook signed with ``X-Hub-Signature-256``.

Test controls (JSON, under ``/_sandbox/``; the in-process :class:`SandboxServer` methods do the same):

- ``POST /_sandbox/rules`` ``{"to": "5511999990001" | "*", "code": 131026, "http_status": 400,
  "times": 1, "webhook_failure_code": 131049, "error_subcode": 2494010}`` - the next ``times`` sends to
  that recipient (``times`` null or absent = every send) fail with that Graph error, or, with only
  ``webhook_failure_code``, are accepted and get one ``failed`` status callback instead of
  sent/delivered/read, or, with ``"hang_up": true``, are accepted and the connection is dropped
  before any answer. Rules apply to sends that pass validation; a recipient's own rules come before
  ``"*"`` rules, oldest first. ``GET`` lists the rules, ``DELETE`` clears them.
- ``POST /_sandbox/config`` ``{"latency_ms": 200, "drop_ninth_digit": true, "webhook_url": "...",
  "app_secret": "...", "status_delays_ms": [20, 40, 60], "waba_id": "...",
  "display_phone_number": "..."}`` - changes only the keys given; ``GET`` shows the configuration.
  Sends and status callbacks that are waiting re-read ``latency_ms`` and ``status_delays_ms``: a
  test holds them with a long delay and releases them with a short one (no fixed sleeps).
- ``GET /_sandbox/messages[?to=DIGITS]`` - ``{"count": N, "messages": [...]}``, accepted sends in order.
  ``DELETE`` forgets the messages and resets the stats.
- ``GET /{version}/{waba_id}/message_templates?limit=&after=&fields=`` - the business account's
  templates as Meta pages them (``sandbox_templates.TEMPLATES``: approved, one rejected, one paused).
- ``GET /_sandbox/stats`` - ``{"accepted", "rejected", "by_recipient_max", "webhooks_delivered",
  "webhooks_failed", "in_flight", "in_flight_max", "webhooks_pending"}`` (sends being answered now
  and at most at once; accepted sends whose status callbacks are not all posted yet).

Run it with ``python manage.py whatsapp_sandbox`` or in-process::

    with SandboxServer(numbers={"1234567890": "tok"}) as server:
        httpx.post(f"{server.url}/v21.0/1234567890/messages", headers={"Authorization": "Bearer tok"}, ...)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import json
import logging
import os
import re
import resource
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from integrations.sandbox_server import ThreadedAppServer
from integrations.whatsapp.sandbox_templates import templates_page

logger = logging.getLogger(__name__)

T = TypeVar("T")

VERSION_RE = re.compile(r"v\d+\.\d+")
TO_RE = re.compile(r"\+?\d{8,15}")
# 55 + two-digit area code + the mobile "9" + eight digits.
BR_MOBILE_RE = re.compile(r"(55\d{2})9(\d{8})")
# Meta refuses template text parameters with these (error 132018: "Param text cannot have
# new-line/tab characters or more than 4 consecutive spaces"). Every line break counts here (\r, a
# vertical tab, U+2028...): the sandbox errs on the strict side, so what passes it passes Meta.
BAD_WHITESPACE_RE = re.compile(r"[\n\r\t\v\f\x85\u2028\u2029]| {5,}")
# The text of a body parameter: 1,024 characters when the template has other components, 32,768 when
# the body is alone (Cloud API reference, parameter object); Meta answers 132005 beyond.
BODY_TEXT_MAX = 1024
BODY_ONLY_TEXT_MAX = 32768

DEFAULT_STATUS_DELAYS_MS: tuple[float, ...] = (20.0, 40.0, 60.0)
STATUS_SEQUENCE = ("sent", "delivered", "read")
# A 1x1 PNG: what every simulated media id downloads as.
SANDBOX_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
COMPONENT_TYPES = frozenset({"header", "body", "button", "carousel", "limited_time_offer"})
BUTTON_SUB_TYPES = frozenset({"url", "quick_reply", "copy_code", "flow", "catalog", "mpm", "voice_call"})
MEDIA_PARAMETER_TYPES = frozenset({"image", "video", "document", "location"})
RATE_LIMIT_CODES = frozenset({4, 80007, 130429, 131056})
MAX_CALLBACK_DATA = 512
ERROR_DOCS = "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/"

# Graph error code -> (message title, details), as Meta words them.
ERRORS: dict[int, tuple[str, str]] = {
    1: ("An unknown error occurred", "Invalid request or possible server error."),
    2: ("Service temporarily unavailable", "Temporary due to downtime or due to being overloaded."),
    4: ("Application request limit reached", "The app has reached its API call rate limit."),
    100: ("Invalid parameter", "The request included one or more unsupported or misspelled parameters."),
    190: ("Invalid OAuth access token - Cannot parse access token", ""),
    368: (
        "Temporarily blocked for policies violations",
        "The WhatsApp Business Account associated with the app has been restricted or disabled "
        "for violating a platform policy.",
    ),
    2500: ("Unknown path components", "The request path is not a known Graph API endpoint."),
    80007: ("Rate limit issues", "The WhatsApp Business Account has reached its rate limit."),
    130429: ("Rate limit hit", "Cloud API message throughput has been reached."),
    130472: (
        "User's number is part of an experiment",
        "Failed to send message because this user's phone number is part of an experiment.",
    ),
    131000: ("Something went wrong", "Message failed to send due to an unknown error."),
    132005: ("Template Hydrated Text Too Long", "Translated text is too long."),
    131008: ("Required parameter is missing", "The request is missing a required parameter."),
    131026: (
        "Message undeliverable",
        "Unable to deliver message. Reasons can include: the recipient phone number is not a WhatsApp "
        "phone number; the recipient has not accepted the new Terms of Service and Privacy Policy; "
        "the recipient is using an old WhatsApp version.",
    ),
    131031: (
        "Account has been locked",
        "The WhatsApp Business Account is restricted or disabled for violating a platform policy, "
        "or the data in the request could not be verified.",
    ),
    131042: (
        "Business eligibility payment issue",
        "There was an error related to your payment method.",
    ),
    131047: (
        "Re-engagement message",
        "More than 24 hours have passed since the recipient last replied to the sender number.",
    ),
    131048: (
        "Spam rate limit hit",
        "Message failed to send because there are restrictions on how many messages can be sent from "
        "this phone number.",
    ),
    131049: (
        "This message was not delivered to maintain healthy ecosystem engagement.",
        "In order to maintain a healthy ecosystem engagement, the message failed to be delivered.",
    ),
    131050: (
        "User has stopped marketing messages",
        "Unable to deliver the message. This recipient has chosen to stop receiving marketing messages "
        "on WhatsApp from your business.",
    ),
    131056: (
        "(Business Account, Consumer Account) pair rate limit hit",
        "Too many messages sent from the sender phone number to the same recipient phone number in a "
        "short period of time.",
    ),
    132000: (
        "Number of parameters does not match the expected number of params",
        "The number of variable parameter values included in the request did not match the number of "
        "variable parameters defined in the template.",
    ),
    132001: (
        "Template name does not exist in the translation",
        "The template does not exist in the specified language or the template has not been approved.",
    ),
    132012: (
        "Parameter format does not match format in the created template",
        "Variable parameter values formatted incorrectly.",
    ),
    132018: (
        "There's an issue with the parameters in your template",
        "Param text cannot have new-line/tab characters or more than 4 consecutive spaces",
    ),
}


def _fbtrace_id() -> str:
    """A random 23-character id shaped like Graph's ``fbtrace_id``."""
    return base64.urlsafe_b64encode(os.urandom(18)).decode()[:23]


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def _json_response(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=_dumps(payload), status=status, content_type="application/json", headers=headers)


def default_http_status(code: int) -> int:
    """The HTTP status Graph answers an error ``code`` with (429 for rate limits, 401 for tokens...)."""
    if code in RATE_LIMIT_CODES:
        return 429
    if code == 190:
        return 401
    if code in (1, 2):
        return 500
    return 400


class GraphError(Exception):
    """A Graph API error; :meth:`response` renders it exactly as Meta does."""

    def __init__(
        self,
        code: int,
        details: str | None = None,
        *,
        http_status: int | None = None,
        message: str | None = None,
        error_subcode: int | None = None,
        retry_after: int | None = None,
    ) -> None:
        title, default_details = ERRORS.get(code, ("Unknown error", "The request could not be processed."))
        self.code = code
        self.http_status = http_status or default_http_status(code)
        # Graph prefixes most messages with the code; token errors (190) and the generic 1/2 have none.
        self.message = message or (title if code in (1, 2, 190) else f"(#{code}) {title}")
        self.details = default_details if details is None else details
        self.error_subcode = error_subcode
        self.retry_after = retry_after
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        """The ``{"error": {...}}`` document, with a fresh ``fbtrace_id``."""
        error: dict[str, Any] = {"message": self.message, "type": "OAuthException", "code": self.code}
        if self.error_subcode is not None:
            error["error_subcode"] = self.error_subcode
        if self.code != 190:
            error["error_data"] = {"messaging_product": "whatsapp", "details": self.details}
        error["fbtrace_id"] = _fbtrace_id()
        return {"error": error}

    def response(self) -> web.Response:
        """The HTTP response Graph would send for this error."""
        body = self.body()
        headers = {"x-fb-trace-id": body["error"]["fbtrace_id"]}
        if self.code == 190:
            headers["WWW-Authenticate"] = f'OAuth "Facebook Platform" "invalid_token" "{self.message}"'
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return _json_response(body, status=self.http_status, headers=headers)


@dataclass
class Rule:
    """A scripted failure for one recipient (``to`` digits) or everyone (``"*"``)."""

    to: str
    code: int | None = None
    http_status: int | None = None
    times: int | None = None
    webhook_failure_code: int | None = None
    error_subcode: int | None = None
    retry_after: int | None = None  # seconds, sent as Retry-After with the error
    # Accepted and recorded, then the connection is dropped before any answer (broken after the request).
    hang_up: bool = False

    @property
    def rejects(self) -> bool:
        """True when the send itself fails; False when it is accepted and fails in the webhook."""
        return self.code is not None or self.http_status is not None

    def error(self) -> GraphError:
        """The Graph error a rejecting rule answers with."""
        code = self.code
        if code is None:
            status = self.http_status or 500
            code = 2 if status >= 500 else {401: 190, 429: 130429}.get(status, 100)
        return GraphError(
            code, http_status=self.http_status, error_subcode=self.error_subcode, retry_after=self.retry_after
        )

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Rule:
        """Build a rule from its JSON form; raises ValueError naming the bad field."""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown rule fields: {sorted(unknown)}")
        hang_up = data.get("hang_up", False)
        if not isinstance(hang_up, bool):
            raise ValueError('"hang_up" must be true or false')
        to = data.get("to")
        if not isinstance(to, str) or not (to == "*" or TO_RE.fullmatch(to)):
            raise ValueError('"to" must be "*" or a phone number of 8-15 digits')
        values: dict[str, int | None] = {}
        for name in ("code", "http_status", "times", "webhook_failure_code", "error_subcode", "retry_after"):
            value = data.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f'"{name}" must be an integer or null')
            values[name] = value
        status, times = values["http_status"], values["times"]
        if status is not None and not 400 <= status <= 599:
            raise ValueError('"http_status" must be an HTTP error status (400-599)')
        if times is not None and times < 1:
            raise ValueError('"times" must be 1 or more, or null for every send')
        if values["retry_after"] is not None and values["retry_after"] < 0:
            raise ValueError('"retry_after" must be 0 or more seconds')
        scripted = (values["code"], status, values["webhook_failure_code"])
        if all(value is None for value in scripted) and not hang_up:
            raise ValueError('a rule needs "code", "http_status", "webhook_failure_code" or "hang_up"')
        return cls(to=to.lstrip("+"), hang_up=hang_up, **values)


@dataclass
class SandboxConfig:
    """What ``POST /_sandbox/config`` and :meth:`SandboxServer.configure` can change."""

    latency_ms: float = 0.0
    drop_ninth_digit: bool = False
    webhook_url: str | None = None
    app_secret: str | None = None
    status_delays_ms: tuple[float, ...] = DEFAULT_STATUS_DELAYS_MS
    waba_id: str = "102290129340398"
    display_phone_number: str = "5511940000000"

    def update(self, changes: Mapping[str, Any]) -> None:
        """Apply ``changes`` all or nothing; raises ValueError naming the bad key."""
        new = dict(asdict(self))
        for key, value in changes.items():
            if key not in new:
                raise ValueError(f"unknown config key {key!r}")
            new[key] = _check_config_value(key, value)
        for key, value in new.items():
            setattr(self, key, value)

    def public(self) -> dict[str, Any]:
        """The configuration as JSON, with the app secret masked."""
        data = asdict(self)
        data["status_delays_ms"] = list(self.status_delays_ms)
        data["app_secret"] = "********" if self.app_secret else None
        return data


def _check_config_value(key: str, value: Any) -> Any:
    """Return ``value`` normalised for config ``key``; raises ValueError if it has the wrong type."""
    check = _CONFIG_CHECKS.get(key)
    if check is not None:
        return check(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a non-empty string")
    return value


def _latency_ms(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError("latency_ms must be a number >= 0")
    return float(value)


def _drop_ninth_digit(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("drop_ninth_digit must be true or false")
    return value


def _status_delays_ms(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list | tuple) or len(value) > len(STATUS_SEQUENCE):
        raise ValueError("status_delays_ms must be a list of at most 3 delays (sent, delivered, read)")
    if any(isinstance(v, bool) or not isinstance(v, int | float) or v < 0 for v in value):
        raise ValueError("status_delays_ms must hold numbers >= 0")
    return tuple(float(v) for v in value)


def _webhook_url(value: Any) -> str | None:
    if value is not None and not (isinstance(value, str) and value.startswith(("http://", "https://"))):
        raise ValueError("webhook_url must be an http(s) URL or null")
    return value


def _app_secret(value: Any) -> str | None:
    if value is not None and not (isinstance(value, str) and value):
        raise ValueError("app_secret must be a non-empty string or null")
    return value


# The config keys that are not a non-empty string, and how each is checked.
_CONFIG_CHECKS: dict[str, Callable[[Any], Any]] = {
    "latency_ms": _latency_ms,
    "drop_ninth_digit": _drop_ninth_digit,
    "status_delays_ms": _status_delays_ms,
    "webhook_url": _webhook_url,
    "app_secret": _app_secret,
}


def _require(condition: bool, code: int, details: str) -> None:
    if not condition:
        raise GraphError(code, details)


def _validate_parameter(component: str, parameter: Any) -> None:
    """Raise the GraphError Meta answers for a bad template parameter."""
    _require(isinstance(parameter, dict), 100, f"Each {component} parameter must be an object")
    kind = parameter.get("type")
    _require(isinstance(kind, str) and bool(kind), 131008, f"Parameter of {component} is missing type")
    if kind == "text":
        text = parameter.get("text")
        _require(
            isinstance(text, str) and bool(text.strip()),
            131008,
            f"Parameter of type text is missing text value in {component}",
        )
        if BAD_WHITESPACE_RE.search(text):
            raise GraphError(132018)
    elif kind in MEDIA_PARAMETER_TYPES:
        media = parameter.get(kind)
        _require(isinstance(media, dict), 131008, f"Parameter of type {kind} is missing {kind} object")
        if kind != "location":
            _require(
                bool(media.get("link") or media.get("id")),
                131008,
                f"Parameter of type {kind} needs link or id",
            )
    elif kind == "payload":
        _require(bool(parameter.get("payload")), 131008, "Parameter of type payload is missing payload value")
    elif kind == "currency":
        currency = parameter.get("currency")
        _require(
            isinstance(currency, dict) and {"fallback_value", "code", "amount_1000"} <= set(currency),
            131008,
            "Parameter of type currency needs fallback_value, code and amount_1000",
        )
    elif kind == "date_time":
        date_time = parameter.get("date_time")
        _require(
            isinstance(date_time, dict) and "fallback_value" in date_time,
            131008,
            "Parameter of type date_time needs fallback_value",
        )
    elif kind not in ("coupon_code", "action", "limited_time_offer"):
        raise GraphError(100, f"Invalid parameter type {kind!r} in {component}")


def _check_body_length(components: list[dict[str, Any]]) -> None:
    """Raise 132005 for a body text parameter over Meta's limit (counted in UTF-16 code units, the
    strict reading of "characters")."""
    alone = all(component.get("type") == "body" for component in components)
    limit = BODY_ONLY_TEXT_MAX if alone else BODY_TEXT_MAX
    for component in components:
        if component.get("type") != "body":
            continue
        for parameter in component.get("parameters", []):
            text = parameter.get("text") if parameter.get("type") == "text" else None
            if isinstance(text, str) and len(text.encode("utf-16-le")) // 2 > limit:
                raise GraphError(132005, f"Param text is over {limit} characters")


def validate_message(payload: Any) -> tuple[str, dict[str, Any]]:
    """Check a send request like Meta; returns ``(to, template)`` or raises :class:`GraphError`."""
    _require(isinstance(payload, dict), 100, "The request body must be a JSON object")
    product = payload.get("messaging_product")
    _require(
        product == "whatsapp", 100, f'Param messaging_product must be one of {{WHATSAPP}} - got "{product}".'
    )
    _require(
        payload.get("recipient_type", "individual") == "individual",
        100,
        "Param recipient_type must be individual",
    )
    to = payload.get("to")
    _require(
        isinstance(to, str) and bool(TO_RE.fullmatch(to)),
        100,
        "Param to must be a phone number of 8 to 15 digits, optionally prefixed with +",
    )
    kind = payload.get("type", "text")
    _require(
        kind in ("template", "text"), 100, f'Param type must be "template" or "text" here - got "{kind}"'
    )
    if kind == "text":
        text = payload.get("text")
        body = text.get("body") if isinstance(text, dict) else None
        _require(isinstance(body, str) and bool(body.strip()), 100, "Param text['body'] is required")
        assert isinstance(body, str)
        _require(len(body) <= 4096, 100, "Param text['body'] must be at most 4096 characters")
        return to, {"type": "text", "body": body}
    template = payload.get("template")
    _require(isinstance(template, dict), 100, "Param template must be an object")
    name = template.get("name")
    _require(isinstance(name, str) and bool(name), 100, "Param template['name'] is required")
    language = template.get("language")
    _require(
        isinstance(language, dict) and isinstance(language.get("code"), str) and bool(language.get("code")),
        100,
        "Param template['language']['code'] is required",
    )
    components = template.get("components", [])
    _require(isinstance(components, list), 100, "Param template['components'] must be an array")
    for component in components:
        _require(isinstance(component, dict), 100, "Each template component must be an object")
        ctype = component.get("type")
        _require(ctype in COMPONENT_TYPES, 100, f"Invalid component type {ctype!r}")
        if ctype == "button":
            sub_type, index = component.get("sub_type"), component.get("index")
            _require(sub_type is not None, 131008, "Button component is missing sub_type")
            _require(index is not None, 131008, "Button component is missing index")
            _require(sub_type in BUTTON_SUB_TYPES, 100, f"Invalid button sub_type {sub_type!r}")
            _require(
                str(index).isdigit() and 0 <= int(str(index)) <= 9,
                100,
                "Button index must be between 0 and 9",
            )
        parameters = component.get("parameters", [])
        _require(isinstance(parameters, list), 100, f"Param parameters of {ctype} must be an array")
        for parameter in parameters:
            _validate_parameter(str(ctype), parameter)
    _check_body_length(components)
    callback = payload.get("biz_opaque_callback_data")
    _require(
        callback is None or (isinstance(callback, str) and len(callback) <= MAX_CALLBACK_DATA),
        100,
        f"Param biz_opaque_callback_data must be a string of at most {MAX_CALLBACK_DATA} characters",
    )
    return to, template


def _bearer_token(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer":
        return token.strip()
    # Graph also takes the token as a query parameter.
    return request.query.get("access_token", "")


@dataclass
class _State:
    """Everything a reset forgets; only ever touched on the server's event loop."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    accepted: int = 0
    rejected: int = 0
    by_recipient: dict[str, int] = field(default_factory=dict)
    by_recipient_max: int = 0
    webhooks_delivered: int = 0
    webhooks_failed: int = 0
    in_flight_max: int = 0
    conversations: dict[str, str] = field(default_factory=dict)


class SandboxServer(ThreadedAppServer):
    """The sandbox as an aiohttp app running on its own event loop in a daemon thread.

    ``numbers`` maps phone_number_id -> token; a token in ``tokens`` is accepted for any
    phone_number_id; with neither, any non-empty token is accepted. The public methods are safe to
    call from any thread while the server runs: they execute on the server's loop.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        numbers: Mapping[str, str] | None = None,
        tokens: Iterable[str] | None = None,
        latency_ms: float = 0,
        webhook_url: str | None = None,
        app_secret: str | None = None,
        *,
        drop_ninth_digit: bool = False,
        status_delays_ms: Iterable[float] = DEFAULT_STATUS_DELAYS_MS,
    ) -> None:
        super().__init__(host, port)
        self._numbers = dict(numbers or {})
        self._tokens = frozenset(tokens or ())
        self._number_tokens = frozenset(self._numbers.values())
        self.config = SandboxConfig()
        self.config.update(
            {
                "latency_ms": latency_ms,
                "webhook_url": webhook_url,
                "app_secret": app_secret,
                "drop_ninth_digit": drop_ninth_digit,
                "status_delays_ms": list(status_delays_ms),
            }
        )
        self._state = _State()
        self._rules: dict[str, list[Rule]] = {}
        self._wamid_prefix = os.urandom(3).hex().upper()
        self._counter = itertools.count(1)
        self._session: aiohttp.ClientSession | None = None
        self._webhook_tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0  # not in _State: a reset while sends are waiting must not lose count
        self._config_changed: asyncio.Event | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        """The aiohttp application (routes only; start() also opens the webhook client session)."""
        app = web.Application(client_max_size=1024**2)
        app.router.add_post("/{version}/{phone_number_id}/messages", self._handle_send)
        app.router.add_get("/{version}/{waba_id}/message_templates", self._handle_templates)
        app.router.add_route("*", "/_sandbox/rules", self._handle_rules)
        app.router.add_route("*", "/_sandbox/config", self._handle_config)
        app.router.add_route("*", "/_sandbox/messages", self._handle_messages)
        app.router.add_get("/_sandbox/stats", self._handle_stats)
        app.router.add_post("/_sandbox/inbound", self._handle_inbound)
        app.router.add_get("/_sandbox/media/{media_id}", self._handle_media_bytes)
        app.router.add_get("/{version}/{media_id}", self._handle_media)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown)
        return app

    thread_name = "whatsapp-sandbox"
    # A deep backlog so a burst of 1,000+ connections is queued, not refused or SYN-retried.
    backlog = 4096

    def before_start(self) -> None:
        _raise_fd_limit()

    async def on_startup(self) -> None:
        # One shared client session for every webhook POST; its pool bounds concurrent callbacks.
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=60),  # a loaded web server still gets its callbacks
            connector=aiohttp.TCPConnector(limit=200),
            headers={"User-Agent": "facebookexternalua"},
        )

    async def on_shutdown(self) -> None:
        tasks = list(self._webhook_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def on_closed(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- thread-safe helpers --------------------------------------------------------------------

    def add_rule(
        self,
        to: str,
        code: int | None = None,
        *,
        http_status: int | None = None,
        times: int | None = None,
        webhook_failure_code: int | None = None,
        error_subcode: int | None = None,
        retry_after: int | None = None,
        hang_up: bool = False,
    ) -> dict[str, Any]:
        """Script failures for ``to`` (or ``"*"``); returns the stored rule. ``times=None`` = always."""
        rule = Rule.parse(
            {
                "to": to,
                "code": code,
                "http_status": http_status,
                "times": times,
                "webhook_failure_code": webhook_failure_code,
                "error_subcode": error_subcode,
                "retry_after": retry_after,
                "hang_up": hang_up,
            }
        )
        return self._on_loop(lambda: self._add_rule(rule))

    def clear_rules(self) -> None:
        """Forget every rule."""
        self._on_loop(self._rules.clear)

    def rules(self) -> list[dict[str, Any]]:
        """The rules still active, with their remaining ``times``."""
        return self._on_loop(self._rule_list)

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Change config keys (see :class:`SandboxConfig`); returns the whole config, secret masked."""

        def apply() -> dict[str, Any]:
            self._update_config(changes)
            return self.config.public()

        return self._on_loop(apply)

    def messages(self, to: str | None = None) -> list[dict[str, Any]]:
        """Accepted sends in order (copies), optionally only those to ``to`` (digits or wa_id)."""
        return self._on_loop(lambda: self._message_list(to))

    def stats(self) -> dict[str, int]:
        """Counters: accepted, rejected, by_recipient_max, webhooks_delivered, webhooks_failed,
        in_flight, in_flight_max, webhooks_pending."""
        return self._on_loop(self._stats)

    def reset(self) -> None:
        """Forget messages, stats and rules (configuration is kept)."""

        def clear() -> None:
            self._state = _State()
            self._rules.clear()

        self._on_loop(clear)

    # -- state (event loop only) ----------------------------------------------------------------

    def _add_rule(self, rule: Rule) -> dict[str, Any]:
        self._rules.setdefault(rule.to, []).append(rule)
        return asdict(rule)

    def _rule_list(self) -> list[dict[str, Any]]:
        return [asdict(rule) for rules in self._rules.values() for rule in rules]

    def _take_rule(self, digits: str) -> Rule | None:
        """The first rule for ``digits`` (else for ``"*"``), with one of its ``times`` used up."""
        for key in (digits, "*"):
            rules = self._rules.get(key)
            if not rules:
                continue
            rule = rules[0]
            if rule.times is not None:
                rule.times -= 1
                if rule.times <= 0:
                    rules.pop(0)
                    if not rules:
                        del self._rules[key]
            return rule
        return None

    def _message_list(self, to: str | None) -> list[dict[str, Any]]:
        records = self._state.messages
        if to:
            digits = to.lstrip("+")
            records = [m for m in records if m["wa_id"] == digits or m["to"].lstrip("+") == digits]
        return [dict(m) for m in records]

    def _stats(self) -> dict[str, int]:
        state = self._state
        return {
            "accepted": state.accepted,
            "rejected": state.rejected,
            "by_recipient_max": state.by_recipient_max,
            "webhooks_delivered": state.webhooks_delivered,
            "webhooks_failed": state.webhooks_failed,
            "in_flight": self._in_flight,
            "webhooks_pending": len(self._webhook_tasks),
            "in_flight_max": state.in_flight_max,
        }

    def _update_config(self, changes: Mapping[str, Any]) -> None:
        self.config.update(changes)
        if self._config_changed is not None:  # wake the waits, which re-read their delay
            self._config_changed.set()
            self._config_changed = None

    async def _wait_until(self, deadline: Callable[[], float]) -> None:
        """Sleep until ``deadline()`` (loop time), re-reading it whenever the configuration changes."""
        loop = asyncio.get_running_loop()
        while (remaining := deadline() - loop.time()) > 0:
            if self._config_changed is None:
                self._config_changed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._config_changed.wait(), remaining)

    def _wa_id(self, digits: str) -> str:
        if self.config.drop_ninth_digit:
            match = BR_MOBILE_RE.fullmatch(digits)
            if match:
                return match.group(1) + match.group(2)
        return digits

    def _new_wamid(self, wa_id: str) -> str:
        # Real wamids are base64 of a small protobuf holding the wa_id and an 18-hex-digit message id;
        # a per-server random prefix plus a counter keeps ours unique.
        message_id = f"{self._wamid_prefix}{next(self._counter):012X}".encode()
        raw = b"\x1c\x18" + bytes([len(wa_id)]) + wa_id.encode() + b"\x15\x02\x00\x11\x18\x12" + message_id
        return "wamid." + base64.b64encode(raw + b"\x00").decode()

    def _check_token(self, phone_number_id: str, token: str) -> None:
        """Raise the Graph error for a token that may not send from ``phone_number_id``."""
        if token and (
            self._numbers.get(phone_number_id) == token
            or token in self._tokens
            or (not self._numbers and not self._tokens)
        ):
            return
        if token in self._number_tokens:
            # A real token, but not for this number: Graph cannot see the object.
            raise GraphError(
                100,
                message=(
                    f"Unsupported post request. Object with ID '{phone_number_id}' does not exist, cannot be "
                    "loaded due to missing permissions, or does not support this operation."
                ),
                details=f"Phone number id {phone_number_id} is not available to this access token",
                error_subcode=33,
            )
        raise GraphError(190)

    def _accept(
        self, phone_number_id: str, to: str, template: dict[str, Any], payload: dict[str, Any]
    ) -> tuple[bool, bytes]:
        """Record a send (or raise the GraphError a rule scripts); returns whether a rule says to drop the
        connection instead of answering, and the 200 response body."""
        digits = to.lstrip("+")
        rule = self._take_rule(digits)
        if rule is not None and rule.rejects:
            raise rule.error()
        wa_id = self._wa_id(digits)
        wamid = self._new_wamid(wa_id)
        callback = payload.get("biz_opaque_callback_data")
        record = {
            "to": to,
            "wa_id": wa_id,
            "wamid": wamid,
            "phone_number_id": phone_number_id,
            "template": template,
            "biz_opaque_callback_data": callback,
            "received_at": datetime.now(UTC).isoformat(),
        }
        state = self._state
        state.messages.append(record)
        state.accepted += 1
        count = state.by_recipient.get(wa_id, 0) + 1
        state.by_recipient[wa_id] = count
        state.by_recipient_max = max(count, state.by_recipient_max)
        config = self.config
        if config.webhook_url and config.app_secret and config.status_delays_ms:
            failure = rule.webhook_failure_code if rule is not None else None
            task = asyncio.get_running_loop().create_task(
                self._deliver_statuses(record, failure, config.webhook_url, config.app_secret)
            )
            self._webhook_tasks.add(task)
            task.add_done_callback(self._webhook_tasks.discard)
        hang_up = rule is not None and rule.hang_up
        return hang_up, _dumps(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": to, "wa_id": wa_id}],
                "messages": [{"id": wamid, "message_status": "accepted"}],
            }
        )

    # -- Graph API ------------------------------------------------------------------------------

    async def _handle_send(self, request: web.Request) -> web.Response:
        # The whole request is received before Meta takes its time, so a client that stops waiting
        # (a read timeout) leaves a send that is still accepted, as it can be at Meta.
        raw = await request.read()
        arrived = asyncio.get_running_loop().time()
        self._in_flight += 1
        self._state.in_flight_max = max(self._state.in_flight_max, self._in_flight)
        try:
            # Sleeping (not blocking) so concurrent requests overlap, as they do against Meta.
            await self._wait_until(lambda: arrived + self.config.latency_ms / 1000)
        finally:
            self._in_flight -= 1
        version = request.match_info["version"]
        phone_number_id = request.match_info["phone_number_id"]
        try:
            if not VERSION_RE.fullmatch(version):
                raise GraphError(2500, message=f"Unknown path components: {request.path}")
            self._check_token(phone_number_id, _bearer_token(request))
            try:
                payload = json.loads(raw)
            except ValueError:
                raise GraphError(100, "The request body is not valid JSON") from None
            to, template = validate_message(payload)
            hang_up, body = self._accept(phone_number_id, to, template, payload)
        except GraphError as error:
            self._state.rejected += 1
            return error.response()
        if hang_up and request.transport is not None:
            request.transport.abort()  # the send is recorded; the client never hears of it
        return web.Response(body=body, content_type="application/json")

    async def _handle_templates(self, request: web.Request) -> web.Response:
        """A business account's templates, paged (`sandbox_templates`); any valid token may read."""
        token = _bearer_token(request)
        open_to_all = not self._numbers and not self._tokens
        if not token or not (open_to_all or token in self._tokens or token in self._number_tokens):
            return GraphError(190).response()
        if not VERSION_RE.fullmatch(request.match_info["version"]):
            return GraphError(2500, message=f"Unknown path components: {request.path}").response()
        query = request.query
        page = templates_page(
            url=str(request.url.with_query(None)),
            limit=query.get("limit", ""),
            after=query.get("after", ""),
            fields=query.get("fields", ""),
        )
        if page is None:
            return GraphError(100, "Invalid cursor").response()
        return _json_response(page)

    async def _handle_unknown(self, request: web.Request) -> web.Response:
        if request.method != "POST" and request.path.rstrip("/").endswith("/messages"):
            return GraphError(100, message=f"Unsupported {request.method.lower()} request.").response()
        return GraphError(2500, message=f"Unknown path components: {request.path}").response()

    # -- status webhooks ------------------------------------------------------------------------

    def _status_payload(
        self, record: dict[str, Any], status: str, failure_code: int | None
    ) -> dict[str, Any]:
        """One Meta status callback document for ``record``."""
        entry: dict[str, Any] = {
            "id": record["wamid"],
            "status": status,
            "timestamp": str(int(time.time())),
            "recipient_id": record["wa_id"],
        }
        if record["biz_opaque_callback_data"] is not None:
            entry["biz_opaque_callback_data"] = record["biz_opaque_callback_data"]
        if status == "failed":
            code = failure_code or 131000
            title, details = ERRORS.get(code, ERRORS[131000])
            entry["errors"] = [
                {
                    "code": code,
                    "title": title,
                    "message": title,
                    "error_data": {"details": details},
                    "href": ERROR_DOCS,
                }
            ]
        elif status in ("sent", "delivered"):
            # Meta sends conversation and pricing with sent and delivered, not with read.
            conversation = self._state.conversations.setdefault(record["wa_id"], os.urandom(16).hex())
            entry["conversation"] = {"id": conversation, "origin": {"type": "marketing"}}
            if status == "sent":
                entry["conversation"]["expiration_timestamp"] = str(int(time.time()) + 86400)
            entry["pricing"] = {
                "billable": True,
                "pricing_model": "PMP",
                "category": "marketing",
                "type": "regular",
            }
        value = {
            "messaging_product": "whatsapp",
            "metadata": {
                "display_phone_number": self.config.display_phone_number,
                "phone_number_id": record["phone_number_id"],
            },
            "statuses": [entry],
        }
        return {
            "object": "whatsapp_business_account",
            "entry": [{"id": self.config.waba_id, "changes": [{"field": "messages", "value": value}]}],
        }

    async def _deliver_statuses(
        self, record: dict[str, Any], failure_code: int | None, url: str, secret: str
    ) -> None:
        """POST the status callbacks for one accepted send, one after another (so they arrive in order)."""
        started = asyncio.get_running_loop().time()
        statuses = ("failed",) if failure_code is not None else STATUS_SEQUENCE
        for index, status in enumerate(statuses[: len(self.config.status_delays_ms)]):

            def due(index: int = index) -> float:
                delays = self.config.status_delays_ms
                return started + (delays[min(index, len(delays) - 1)] / 1000 if delays else 0)

            await self._wait_until(due)
            body = _dumps(self._status_payload(record, status, failure_code))
            await self._post_webhook(url, secret, body)

    async def _post_webhook(self, url: str, secret: str, body: bytes) -> None:
        """POST one signed callback; failures are logged and counted, never raised."""
        session = self._session
        if session is None:
            return
        key = secret.encode()
        headers = {
            "Content-Type": "application/json",
            "X-Hub-Signature-256": "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest(),
            # Meta still sends the legacy SHA-1 signature alongside.
            "X-Hub-Signature": "sha1=" + hmac.new(key, body, hashlib.sha1).hexdigest(),
        }
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                ok = response.status < 300
                if not ok:
                    logger.warning("whatsapp sandbox: webhook %s answered HTTP %s", url, response.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("whatsapp sandbox: webhook %s failed: %r", url, exc)
            ok = False
        if ok:
            self._state.webhooks_delivered += 1
        else:
            self._state.webhooks_failed += 1

    # -- controls -------------------------------------------------------------------------------

    async def _read_json(self, request: web.Request) -> dict[str, Any]:
        try:
            data = json.loads(await request.read() or b"{}")
        except ValueError:
            raise ValueError("the body must be JSON") from None
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data

    async def _handle_rules(self, request: web.Request) -> web.Response:
        if request.method == "GET":
            return _json_response({"rules": self._rule_list()})
        if request.method == "DELETE":
            self._rules.clear()
            return _json_response({"rules": []})
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST", "DELETE"])
        try:
            rule = Rule.parse(await self._read_json(request))
        except ValueError as exc:
            return _json_response({"error": str(exc)}, status=400)
        return _json_response({"rule": self._add_rule(rule)})

    async def _handle_config(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            try:
                self._update_config(await self._read_json(request))
            except ValueError as exc:
                return _json_response({"error": str(exc)}, status=400)
        elif request.method != "GET":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        return _json_response(self.config.public())

    async def _handle_messages(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            conversations = self._state.conversations
            self._state = _State(conversations=conversations)
            return _json_response({"count": 0, "messages": []})
        if request.method != "GET":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "DELETE"])
        records = self._message_list(request.query.get("to"))
        return _json_response({"count": len(records), "messages": records})

    async def _handle_stats(self, request: web.Request) -> web.Response:
        return _json_response(self._stats())

    async def _handle_inbound(self, request: web.Request) -> web.Response:
        """Simulate a customer's message: ``{"from": "5511...", "text": "PARAR", "phone_number_id":
        "...", "type": "text"|"button"|"image", "context_id": "wamid...", "name": "Ana"}`` is POSTed
        to the webhook as Meta would (signed); answers ``{"wamid", "delivered"}``."""
        try:
            data = await self._read_json(request)
            payload, wamid = self._inbound_payload(data)
        except ValueError as exc:
            return _json_response({"error": str(exc)}, status=400)
        config = self.config
        if not (config.webhook_url and config.app_secret):
            return _json_response({"error": "configure webhook_url and app_secret first"}, status=409)
        before = self._state.webhooks_delivered
        await self._post_webhook(config.webhook_url, config.app_secret, _dumps(payload))
        return _json_response({"wamid": wamid, "delivered": self._state.webhooks_delivered > before})

    async def _handle_media(self, request: web.Request) -> web.Response:
        """Meta's media lookup: the (short-lived) URL of a media id a simulated inbound carried."""
        if not _bearer_token(request):
            return GraphError(190).response()
        media_id = request.match_info["media_id"]
        if not media_id.startswith("media-"):
            return GraphError(
                100, message=f"Unsupported get request. Object with ID '{media_id}' does not exist"
            ).response()
        url = str(request.url.with_path(f"/_sandbox/media/{media_id}").with_query(None))
        return _json_response(
            {"url": url, "mime_type": "image/png", "id": media_id, "messaging_product": "whatsapp"}
        )

    async def _handle_media_bytes(self, request: web.Request) -> web.Response:
        if not _bearer_token(request):
            return GraphError(190).response()
        return web.Response(body=SANDBOX_PNG, content_type="image/png")

    def _inbound_payload(self, data: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        sender = str(data.get("from", "")).lstrip("+")
        if not TO_RE.fullmatch(sender):
            raise ValueError("from must be a phone number of 8 to 15 digits")
        phone_number_id = str(data.get("phone_number_id") or next(iter(self._numbers), "") or "1234567890")
        kind = str(data.get("type", "text"))
        text = str(data.get("text", ""))
        wamid = "wamid.IN" + self._new_wamid(sender).removeprefix("wamid.")
        message: dict[str, Any] = {
            "from": sender,
            "id": wamid,
            "timestamp": str(int(time.time())),
            "type": kind,
        }
        if kind == "text":
            message["text"] = {"body": text}
        elif kind == "button":
            message["button"] = {"text": text, "payload": str(data.get("payload", text))}
        elif kind in ("image", "audio", "video", "document", "sticker"):
            message[kind] = {
                "id": f"media-{wamid[-12:]}",
                "mime_type": str(data.get("mime_type", "image/jpeg")),
            }
            if text:
                message[kind]["caption"] = text
        else:
            raise ValueError("type must be text, button, image, audio, video, document or sticker")
        if data.get("context_id"):
            message["context"] = {"from": self.config.display_phone_number, "id": str(data["context_id"])}
        value = {
            "messaging_product": "whatsapp",
            "metadata": {
                "display_phone_number": self.config.display_phone_number,
                "phone_number_id": phone_number_id,
            },
            "contacts": [{"profile": {"name": str(data.get("name", ""))}, "wa_id": sender}],
            "messages": [message],
        }
        payload = {
            "object": "whatsapp_business_account",
            "entry": [{"id": self.config.waba_id, "changes": [{"field": "messages", "value": value}]}],
        }
        return payload, wamid


def _raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one: 1,000+ concurrent connections need the fds."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
