"""The processes' provider clients: one Graph API client (and its keep-alive pool) per process,
event loop and base URL, for every app that sends WhatsApp messages (campaigns, surveys)."""

from __future__ import annotations

import atexit
import contextlib

from django.conf import settings

from crm import aio
from integrations import http
from integrations.whatsapp.client import GraphClient

_clients: dict[tuple[int, str], GraphClient] = {}


@atexit.register
def _close_clients() -> None:
    for client in _clients.values():
        with contextlib.suppress(Exception):  # the loop may already be gone at exit
            aio.run(client.session.close(), timeout=2)
    _clients.clear()


def graph_client(base_url: str) -> GraphClient:
    """One client (and keep-alive pool) per process and Graph base URL, on the process's loop."""
    key = (id(aio.loop()), base_url)
    if key not in _clients:

        async def make() -> GraphClient:
            return GraphClient(
                session=http.async_session(max_connections=settings.WHATSAPP_MAX_IN_FLIGHT),
                base_url=base_url,
                version=settings.WHATSAPP_GRAPH_VERSION,
            )

        _clients[key] = aio.run(make())
    return _clients[key]
