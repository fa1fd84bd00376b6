"""The one outbound HTTP seam: default timeouts, a user agent, and no automatic retry of a POST.

`client()` (httpx) for ordinary calls; `post_pool()` (integrations.http_pool) where one process
keeps hundreds of POSTs in flight (WhatsApp sends).

A retried POST can send a message twice, so retries are the job's decision, never the client's;
what a failure means (retry, maybe delivered, permanent; Retry-After) is integrations.retry's rule,
and `no_answer_error`/`status_error` turn it into the IntegrationError the httpx clients raise.
Every connection is made through integrations.outbound.peer_addresses (no loopback, private or
link-local address unless the deployment allows it or an operator trusted the origin), on every
redirect hop: OutboundURLError. `requests_session()` is the same seam for libraries built on
requests (anymail's ESP backends). Answers are capped (ResponseTooLarge).
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx
import requests
import requests.adapters
import urllib3
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from integrations import outbound, retry
from integrations.errors import IntegrationError
from integrations.http_pool import PostPool
from integrations.text import excerpt

USER_AGENT = "crm-queue-platform/0.1"
# connect, read, write, pool (seconds): a slow provider must never hold a worker forever.
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=20.0, write=10.0, pool=30.0)
# The longest answer read from a configured URL (an ERP page of 1,000 customers is far less).
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


def client(
    *,
    base_url: str = "",
    timeout: httpx.Timeout | None = None,
    headers: dict[str, str] | None = None,
    max_connections: int = 20,
    max_response_bytes: int = MAX_RESPONSE_BYTES,
    follow_redirects: bool = False,
) -> httpx.Client:
    return httpx.Client(
        base_url=base_url,
        timeout=timeout or DEFAULT_TIMEOUT,
        follow_redirects=follow_redirects,
        headers={"User-Agent": USER_AGENT, **(headers or {})},
        transport=GuardedTransport(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            max_response_bytes=max_response_bytes,
        ),
        trust_env=False,
    )


def no_answer_error(what: str, exc: httpx.HTTPError, *, idempotent: bool) -> IntegrationError:
    """The IntegrationError of a request that got no answer (integrations.retry decides): retryable
    unless it can never work; `maybe_delivered` when a non-idempotent request may have taken effect."""
    decision = retry.for_transport(retry.httpx_transport(exc), idempotent=idempotent)
    if isinstance(exc, httpx.TimeoutException):
        message = f"{what}: timed out ({type(exc).__name__})"
    else:
        message = f"{what}: {type(exc).__name__}: {exc}"
    return IntegrationError(
        message,
        retryable=decision.verdict is not retry.Verdict.PERMANENT,
        maybe_delivered=decision.verdict is retry.Verdict.MAYBE_DELIVERED,
    )


def status_error(what: str, response: httpx.Response, *, details: str) -> IntegrationError:
    """The IntegrationError of an answer that is not a success (integrations.retry decides)."""
    decision = retry.for_response(response)
    return IntegrationError(
        f"{what}: HTTP {response.status_code}",
        retryable=decision.retryable,
        status=response.status_code,
        details=excerpt(details),  # what a provider answered reaches pages only as a short excerpt
        retry_after=decision.delay,
    )


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's sockets, connected through integrations.outbound: to the checked addresses of
    the host, on every connection a client opens (the first request's and any redirect's)."""

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        error: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for peer in outbound.peer_addresses(host, port):
            try:
                return super().connect_tcp(peer, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error


class ResponseTooLarge(httpx.RemoteProtocolError):
    """An answer longer than MAX_RESPONSE_BYTES: not read any further."""


class _CappedStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, limit: int) -> None:
        self._inner, self._limit = inner, limit

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise ResponseTooLarge(f"the answer is longer than {self._limit} bytes")
            yield chunk

    def close(self) -> None:
        self._inner.close()


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """The certificate-checking context every client of this process shares (safe across threads):
    loading the CA bundle costs ~30 ms of CPU, twice per client when each made its own."""
    return httpx.create_ssl_context(trust_env=False)


class GuardedTransport(httpx.HTTPTransport):
    """httpx's transport with GuardedBackend's sockets (the name stays in the Host header, SNI and
    the certificate check) and answers capped at `max_response_bytes`. No proxy from the
    environment: the guard checks the address actually connected to."""

    def __init__(self, *, limits: httpx.Limits, max_response_bytes: int, retries: int = 0) -> None:
        super().__init__(limits=limits, retries=retries, trust_env=False, verify=ssl_context())
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            retries=retries,
            network_backend=GuardedBackend(),
        )
        self.max_response_bytes = max_response_bytes

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        outbound.check_scheme(str(request.url))
        response = super().handle_request(request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _CappedStream(response.stream, self.max_response_bytes)
        return response


class _GuardedConnect:
    """urllib3's connection, its socket connected to the checked addresses of the host (the name
    stays in the Host header, SNI and the certificate check: urllib3 reads them after connecting)."""

    _dns_host: str
    port: int

    def _new_conn(self) -> Any:
        name, error = self._dns_host, None
        for peer in outbound.peer_addresses(name, self.port):
            self._dns_host = peer
            try:
                return super()._new_conn()  # type: ignore[misc]
            except (NewConnectionError, ConnectTimeoutError) as exc:
                error = exc
            finally:
                self._dns_host = name
        assert error is not None
        raise error


class _GuardedHTTPConnection(_GuardedConnect, urllib3.connection.HTTPConnection):
    pass


class _GuardedHTTPSConnection(_GuardedConnect, urllib3.connection.HTTPSConnection):
    pass


class _GuardedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class RequestsResponseTooLarge(requests.RequestException):
    """An answer longer than the session's cap: not read any further."""


class GuardedAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter over GuardedConnect's sockets, reading at most `max_response_bytes`."""

    def __init__(self, *, max_response_bytes: int) -> None:
        self.max_response_bytes = max_response_bytes
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _GuardedHTTPPool, "https": _GuardedHTTPSPool}

    def send(  # type: ignore[override]  # the same arguments, passed on as they came
        self, request: requests.PreparedRequest, stream: bool = False, **kwargs: Any
    ) -> requests.Response:
        outbound.check_scheme(str(request.url))
        response = super().send(request, stream=True, **kwargs)
        if stream:
            return response
        body = response.raw.read(self.max_response_bytes + 1, decode_content=True)
        response.close()
        if len(body) > self.max_response_bytes:
            raise RequestsResponseTooLarge(
                f"the answer is longer than {self.max_response_bytes} bytes", request=request
            )
        response._content = body
        return response


class _NoRedirects(requests.Session):
    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs["allow_redirects"] = False
        return super().request(*args, **kwargs)


def requests_session(*, max_response_bytes: int = 1024 * 1024) -> requests.Session:
    """A requests session through the guard, for libraries built on requests (anymail's ESP
    backends): every connection checked, answers capped, redirects never followed (a 3xx is the
    answer; an API never needs one), no proxy from the environment."""
    session = _NoRedirects()
    session.trust_env = False
    adapter = GuardedAdapter(max_response_bytes=max_response_bytes)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


# Seconds to connect, and for a POST's whole answer once written, on the send path's pool.
POOL_CONNECT_TIMEOUT = 5.0
POOL_ANSWER_TIMEOUT = 20.0


def post_pool(base_url: str, *, max_connections: int = 500, max_body: int = MAX_RESPONSE_BYTES) -> PostPool:
    """Many POSTs in flight at once to `base_url`'s origin, over a keep-alive pool of
    `max_connections` (integrations.http_pool: the guard's addresses, this seam's certificate
    context and user agent). Create, use and close it on one event loop (see crm.aio).

    Neither httpx nor aiohttp here: httpx's pool slows down sharply with hundreds of concurrent
    requests on one client (1.7-6.4 s for 200 requests to a no-latency server, measured here), and
    an aiohttp request costs about twice this pool's CPU (benchmarks/http_clients.py), which at
    Meta's top tier was most of a send worker's time."""
    return PostPool(
        base_url,
        limit=max_connections,
        headers={"User-Agent": USER_AGENT},
        ssl_context=ssl_context(),
        connect_timeout=POOL_CONNECT_TIMEOUT,
        answer_timeout=POOL_ANSWER_TIMEOUT,
        max_body=max_body,
    )
