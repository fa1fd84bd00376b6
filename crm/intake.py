"""What every inbound intake (Meta's webhooks, the runner's webhooks, ESP tracking) does with a
request body before anything else: read it within a size limit and parse it as strict JSON.

Strict means what PostgreSQL's jsonb and a provider's retry logic need: UTF-8, no NUL character
and no lone surrogate anywhere (jsonb refuses both: accepted, the event would fail to store, a
500), no NaN or Infinity and no number that overflows a double (1e400), no integer PostgreSQL
cannot hold as a number, nesting at most MAX_DEPTH deep. Anything else is the sender's mistake and
answers a 4xx with a JSON error, never a 5xx (a provider retries a 5xx for days).
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, InternalError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

logger = logging.getLogger(__name__)

MAX_BYTES = 1024 * 1024  # a webhook body larger than this is refused with 413
MAX_DEPTH = 32  # objects and arrays nested deeper than this are refused with 400
MAX_INT_DIGITS = 30
RETRY_AFTER = 5  # seconds a sender is asked to wait while the database is unreachable


class BadBody(ValueError):
    """A body an intake refuses; `status` is 400 (malformed) or 413 (too large)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status

    def response(self) -> JsonResponse:
        return JsonResponse({"ok": False, "error": str(self)[:300]}, status=self.status)


def read_body(request: HttpRequest, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The raw body, refused (413) above `max_bytes` before it is read when the length is declared."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise BadBody("Content-Length is not a number") from None
    if declared > max_bytes:
        raise BadBody(f"the body is larger than {max_bytes} bytes", status=413)
    try:
        raw = request.body
    except RequestDataTooBig:
        raise BadBody(f"the body is larger than {max_bytes} bytes", status=413) from None
    if len(raw) > max_bytes:
        raise BadBody(f"the body is larger than {max_bytes} bytes", status=413)
    return raw


def _constant(name: str) -> Any:
    raise BadBody(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadBody(f"the number {text[:40]} is out of range")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise BadBody(f"the integer {text[:40]}… has more than {MAX_INT_DIGITS} digits")
    return int(text)


def _check_text(value: str, where: str) -> None:
    if "\x00" in value:
        raise BadBody(f"{where} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadBody(f"{where} contains a lone surrogate") from None


def _check(value: Any, depth: int, where: str) -> None:
    if isinstance(value, str):
        _check_text(value, where)
    elif isinstance(value, dict):
        if depth >= MAX_DEPTH:
            raise BadBody(f"nested deeper than {MAX_DEPTH} levels")
        for key, item in value.items():
            _check_text(key, f"a key in {where}")
            _check(item, depth + 1, f"{where}.{key[:40]}")
    elif isinstance(value, list):
        if depth >= MAX_DEPTH:
            raise BadBody(f"nested deeper than {MAX_DEPTH} levels")
        for i, item in enumerate(value):
            _check(item, depth + 1, f"{where}[{i}]")


def parse_json(raw: bytes) -> Any:
    """The body as strict JSON (see the module docstring); raises BadBody (400) otherwise."""
    if not raw.strip():
        raise BadBody("the body is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadBody("the body is not UTF-8") from None
    # Counted before parsing, so a body of a million "[" never reaches the parser's recursion.
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth(text) > MAX_DEPTH:
        raise BadBody(f"nested deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except BadBody:
        raise
    except (ValueError, RecursionError) as exc:
        raise BadBody(f"not JSON: {exc}"[:300]) from None
    _check(value, 0, "the body")
    return value


def check_json(value: Any) -> None:
    """Raise BadBody when `value` (already parsed) holds what jsonb refuses: a NUL or a lone
    surrogate in a string or key, or nesting deeper than MAX_DEPTH (a form's JSON field)."""
    _check(value, 0, "the value")


def _depth(text: str) -> int:
    """The deepest nesting of brackets outside strings."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def json_object(raw: bytes) -> dict[str, Any]:
    """`parse_json`, and the top level must be an object."""
    value = parse_json(raw)
    if not isinstance(value, dict):
        raise BadBody(f"the body must be a JSON object, not {type(value).__name__}")
    return value


def database_unavailable() -> JsonResponse:
    """503 with Retry-After: the event was not stored, the sender must send it again."""
    response = JsonResponse({"ok": False, "error": "the database is unavailable; retry later"}, status=503)
    response["Retry-After"] = str(RETRY_AFTER)
    return response


def durable(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """An intake view that answers 503 (Retry-After, JSON) when PostgreSQL cannot be reached or
    refuses to write (a failover's read-only standby), so nothing is acknowledged that was not stored."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except (OperationalError, InterfaceError, InternalError) as exc:
            logger.warning("%s: database unavailable, answered 503: %s", request.path, exc)
            return database_unavailable()

    return wrapped


INTAKE_PATHS = ("/webhooks/", "/hooks/", "/anymail/")
# Headers of an error answer kept when it is rewritten as JSON.
_KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate")


class JsonErrorsMiddleware:
    """Every error answered on an intake path is JSON, `{"ok": false, "error": "..."}` with its
    status, as the intakes' own refusals are: the 404 of a URL no intake has, the 405 of a method
    its view does not take (its Allow header kept), and whatever else Django would answer with an
    HTML page (400 for a bad Host, 413, 500). A webhook sender's log then shows why, not a page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            response.status_code < 400
            or not request.path_info.startswith(INTAKE_PATHS)
            or response.get("Content-Type", "").startswith("application/json")
        ):
            return response
        json_response = JsonResponse(
            {"ok": False, "error": _error_text(request, response)}, status=response.status_code
        )
        for name in _KEPT_HEADERS:
            if name in response:
                json_response[name] = response[name]
        return json_response


def _error_text(request: HttpRequest, response: HttpResponse) -> str:
    if response.status_code == 404:
        return "no intake at this URL"
    if response.status_code == 405:
        allowed = response.get("Allow", "")
        return f"method {str(request.method)[:20]} not allowed here" + (f"; use {allowed}" if allowed else "")
    try:
        return HTTPStatus(response.status_code).phrase.lower()
    except ValueError:
        return f"error {response.status_code}"


class DatabaseUnavailableMiddleware:
    """`durable` for every intake path, views the project does not write included (django-anymail's
    tracking webhooks): a database that cannot be reached answers 503 with Retry-After, not 500."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if request.path.startswith(INTAKE_PATHS) and isinstance(
            exception, OperationalError | InterfaceError | InternalError
        ):
            logger.warning("%s: database unavailable, answered 503: %s", request.path, exception)
            return database_unavailable()
        return None


class NulParametersMiddleware:
    """A request whose query parameters (or, off the intake paths, form fields) carry a NUL
    character answers 400: PostgreSQL refuses NUL in text, so a search, a filter, an autocomplete
    term or a lookup with one would reach the database and fail it (a 500)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if _has_nul(request.GET) or (
            request.method == "POST"
            and not request.path_info.startswith(INTAKE_PATHS)
            and request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data")
            and _has_nul(request.POST)
        ):
            return HttpResponseBadRequest("NUL characters are not accepted in parameters.")
        return self.get_response(request)


def _has_nul(params: Any) -> bool:
    return any("\x00" in key or any("\x00" in v for v in values) for key, values in params.lists())
