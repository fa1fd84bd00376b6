"""The one outbound HTTP seam: default timeouts, a user agent, and no automatic retry of a POST.

`client()` (httpx) for ordinary calls; `async_session()` (aiohttp) where one process keeps
hundreds of requests in flight (WhatsApp sends).

A retried POST can send a message twice, so retries are the job's decision, never the client's;
what a failure means (retry, maybe delivered, permanent; Retry-After) is integrations.retry's rule,
and `no_answer_error`/`status_error` turn it into the IntegrationError the httpx clients raise.
Every request is checked against integrations.outbound first (no loopback, private or link-local
address unless the deployment allows it or an operator trusted the origin): OutboundURLError.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver
from django.conf import settings

from integrations import outbound, retry
from integrations.errors import IntegrationError

USER_AGENT = "crm-queue-platform/0.1"
# connect, read, write, pool (seconds): a slow provider must never hold a worker forever.
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=20.0, write=10.0, pool=30.0)


def client(
    *,
    base_url: str = "",
    timeout: httpx.Timeout | None = None,
    headers: dict[str, str] | None = None,
    max_connections: int = 20,
) -> httpx.Client:
    return httpx.Client(
        base_url=base_url,
        timeout=timeout or DEFAULT_TIMEOUT,
        headers={"User-Agent": USER_AGENT, **(headers or {})},
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        transport=GuardedTransport(retries=0),
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
        details=details,
        retry_after=decision.delay,
    )


class GuardedTransport(httpx.HTTPTransport):
    """Connects to the address integrations.outbound checked, not to a fresh lookup of the name
    (which DNS rebinding could point inside): the URL's host becomes that address, while the Host
    header keeps the name and TLS keeps it for SNI and the certificate check."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        address = outbound.connect_address(str(request.url))
        if address is not None:
            name = request.url.host
            request.url = request.url.copy_with(host=address)
            if request.url.scheme == "https":
                request.extensions = {**request.extensions, "sni_hostname": name}
        return super().handle_request(request)


class GuardedResolver(AbstractResolver):
    """aiohttp's connector resolves names through this: a name with a forbidden address is refused
    at the lookup whose addresses the connection then uses (no second lookup to rebind)."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> Any:
        infos = await self._inner.resolve(host, port, family)
        if settings.ALLOW_PRIVATE_OUTBOUND_URLS:
            return infos
        addresses = [ipaddress.ip_address(i["host"].split("%")[0]) for i in infos]
        forbidden = [a for a in addresses if outbound.forbidden_address(a)]
        if forbidden and not await asyncio.to_thread(outbound.trusted_host, host, port):
            raise outbound.forbidden(host, forbidden[0])
        return infos

    async def close(self) -> None:
        await self._inner.close()


async def _async_guard(
    session: aiohttp.ClientSession, context: object, params: aiohttp.TraceRequestStartParams
) -> None:
    """The scheme, and a host that is an address itself (the connector resolves no address)."""
    url = params.url
    if settings.ALLOW_PRIVATE_OUTBOUND_URLS:
        return
    if url.scheme not in ("http", "https") or url.host is None or outbound.is_literal(url.host):
        await asyncio.to_thread(outbound.check_request_url, str(url))  # the trusted origins: a query


ASYNC_TIMEOUT = aiohttp.ClientTimeout(total=30.0, connect=5.0, sock_connect=5.0, sock_read=20.0)


def async_session(
    *,
    max_connections: int = 500,
    timeout: aiohttp.ClientTimeout | None = None,
    headers: dict[str, str] | None = None,
) -> aiohttp.ClientSession:
    """Many requests in flight at once over a keep-alive pool of `max_connections`.

    aiohttp rather than httpx here: httpx's pool slows down sharply with hundreds of concurrent
    requests on one client (1.7-6.4 s for 200 requests to a no-latency server, measured here);
    aiohttp does not. Create and use it on one event loop (see crm.aio).
    """
    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(_async_guard)
    return aiohttp.ClientSession(
        trace_configs=[trace],
        timeout=timeout or ASYNC_TIMEOUT,
        headers={"User-Agent": USER_AGENT, **(headers or {})},
        connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, resolver=GuardedResolver()),
    )
