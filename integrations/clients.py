"""The processes' provider clients: one Graph API client (and its keep-alive pool) per process,
event loop and base URL, for every app that sends WhatsApp messages (campaigns, surveys); each
closed by crm.aio when the process exits."""

from __future__ import annotations

from django.conf import settings

from crm import aio
from integrations import http
from integrations.http_pool import PostPool
from integrations.outbound import OutboundURLError
from integrations.whatsapp.client import GraphClient

MAX_ANSWER = 256 * 1024  # a send's answer is a few hundred bytes
_clients: dict[tuple[int, str], GraphClient] = {}


def graph_client(base_url: str) -> GraphClient:
    """One client (and keep-alive pool) per process and Graph base URL, on the process's loop."""
    key = (id(aio.loop()), base_url)
    if key not in _clients:

        async def make() -> PostPool:
            in_flight = settings.WHATSAPP_MAX_IN_FLIGHT
            return http.post_pool(base_url, max_connections=in_flight, max_body=MAX_ANSWER)

        try:
            pool = aio.run(make())
        except (ValueError, OutboundURLError) as exc:
            # A URL the pool cannot post to (credentials, a query, no host, a name beyond IDNA): its
            # sends stop with the reason, as when the guard refuses its address, and nothing is sent.
            return GraphClient(pool=None, version=settings.WHATSAPP_GRAPH_VERSION, refused=str(exc))
        _clients[key] = GraphClient(pool=pool, version=settings.WHATSAPP_GRAPH_VERSION)
        aio.at_close(pool.close)  # its keep-alive connections end when the process does
    return _clients[key]
