"""The one rule for "is this HTTP failure worth another try": every outbound client classifies here.

Pure: an answer's status (and Retry-After) or a transport failure in, a `Decision` out. Nothing is
retried here (integrations.http): the job decides, from the decision and its own domain layer on
top (Meta's error codes, an ESP's refusal, the runner's per-item answers).

- 2xx: OK. 1xx/3xx (redirects are not followed) and 4xx other than 408/425/429: PERMANENT.
- 408, 425, 429, 5xx: RETRY, after the answer's Retry-After when it has one (bounded).
- no answer: the connection was never made (refused, DNS, connect timeout, TLS, pool) -> RETRY;
  the request went out and no answer came back (read timeout, connection dropped) -> RETRY for an
  idempotent call, MAYBE_DELIVERED otherwise: the server may have acted on it, so a resend could
  act twice (a WhatsApp message reaching the customer twice); the caller must not resend blindly.
- a URL or request that can never work (bad scheme, malformed URL) -> PERMANENT.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum

import httpx
import requests
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError

from integrations import http_pool

# The most a Retry-After is obeyed (seconds): a provider's "come back tomorrow" must not park work
# for a day without anyone seeing it; the job's own backoff takes over after that.
MAX_RETRY_AFTER = 3600.0
RETRYABLE_STATUSES = frozenset({408, 425, 429})  # timeout, too early, too many requests
_DELAY_SECONDS = re.compile(r"[0-9]+")


class Verdict(StrEnum):
    OK = "ok"
    RETRY = "retry"  # the same call may succeed later; it did not take effect
    MAYBE_DELIVERED = "maybe_delivered"  # no answer to a non-idempotent call: it may have taken effect
    PERMANENT = "permanent"  # the same call will fail again


class Transport(StrEnum):
    """How far a request that got no answer went."""

    NOT_SENT = "not_sent"  # the connection was never made: the server cannot have seen it
    MAYBE_SENT = "maybe_sent"  # written (maybe partly) and no answer: the server may have acted
    INVALID = "invalid"  # a URL or request that can never be sent


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    delay: float | None = None  # seconds to wait first (Retry-After), only with RETRY

    @property
    def retryable(self) -> bool:
        return self.verdict is Verdict.RETRY


def retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After value (RFC 9110 10.2.3: delay-seconds or an HTTP-date), within
    [0, MAX_RETRY_AFTER]; None when absent or unreadable. Never raises."""
    if value is None:
        return None
    text = value.strip()
    if _DELAY_SECONDS.fullmatch(text):
        # More digits than any sane delay: capped without converting (int() of a huge string is slow).
        return MAX_RETRY_AFTER if len(text) > 9 else min(float(int(text)), MAX_RETRY_AFTER)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # an HTTP-date is always GMT
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, min(seconds, MAX_RETRY_AFTER))


def for_status(
    status: int, *, retry_after_header: str | None = None, now: datetime | None = None
) -> Decision:
    """The decision for an HTTP answer."""
    if 200 <= status < 300:
        return Decision(Verdict.OK)
    if status in RETRYABLE_STATUSES or status >= 500:
        return Decision(Verdict.RETRY, retry_after(retry_after_header, now=now))
    return Decision(Verdict.PERMANENT)


def for_response(response: httpx.Response) -> Decision:
    return for_status(response.status_code, retry_after_header=response.headers.get("Retry-After"))


def for_transport(transport: Transport, *, idempotent: bool) -> Decision:
    """The decision for a request that got no answer."""
    if transport is Transport.INVALID:
        return Decision(Verdict.PERMANENT)
    if transport is Transport.MAYBE_SENT and not idempotent:
        return Decision(Verdict.MAYBE_DELIVERED)
    return Decision(Verdict.RETRY)


# -- how far a failed request went, per HTTP library ---------------------------------------------

_HTTPX_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError)
_HTTPX_INVALID = (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL)
_REQUESTS_NOT_SENT = (requests.exceptions.ConnectTimeout, requests.exceptions.SSLError)
_REQUESTS_INVALID = (
    requests.exceptions.InvalidURL,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidSchema,
)


def httpx_transport(exc: Exception) -> Transport:
    """How far an httpx request went before `exc` (any httpx.HTTPError or InvalidURL)."""
    if isinstance(exc, _HTTPX_INVALID):
        return Transport.INVALID
    if isinstance(exc, _HTTPX_NOT_SENT):
        return Transport.NOT_SENT
    return Transport.MAYBE_SENT


def pool_transport(exc: http_pool.PoolError) -> Transport:
    """How far a request of integrations.http_pool went before `exc`."""
    return Transport.NOT_SENT if isinstance(exc, http_pool.NotSent) else Transport.MAYBE_SENT


def requests_transport(exc: requests.RequestException) -> Transport:
    """How far a requests call went before `exc` (anymail's ESP backends use requests)."""
    if isinstance(exc, _REQUESTS_INVALID):
        return Transport.INVALID
    if isinstance(exc, _REQUESTS_NOT_SENT):
        return Transport.NOT_SENT
    if isinstance(exc, requests.exceptions.ConnectionError):
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        inner = cause.args[0] if cause.args else None
        # urllib3's NewConnectionError (refused, DNS) is a ConnectTimeoutError.
        if isinstance(inner, MaxRetryError) and isinstance(inner.reason, ConnectTimeoutError):
            return Transport.NOT_SENT
    return Transport.MAYBE_SENT
