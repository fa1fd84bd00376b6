"""The one outbound HTTP seam: default timeouts, a user agent, and no automatic retry of a POST.

`client()` (httpx) for ordinary calls; `async_session()` (aiohttp) where one process keeps
hundreds of requests in flight (WhatsApp sends).

A retried POST can send a message twice, so retries are the job's decision, never the client's.
Every request is checked against integrations.outbound first (no loopback, private or link-local
address unless the deployment allows it or an operator trusted the origin): OutboundURLError.
"""

from __future__ import annotations

import asyncio

import aiohttp
import httpx

from integrations import outbound

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
        transport=httpx.HTTPTransport(retries=0),
        event_hooks={"request": [_guard]},
    )


def _guard(request: httpx.Request) -> None:
    outbound.check_request_url(str(request.url))


async def _async_guard(
    session: aiohttp.ClientSession, context: object, params: aiohttp.TraceRequestStartParams
) -> None:
    url = str(params.url)
    if outbound.needs_check(url):  # a lookup (DNS, the trusted origins): off the event loop
        await asyncio.to_thread(outbound.check_request_url, url)


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
        connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0),
    )
