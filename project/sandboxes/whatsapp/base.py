"""The sandbox server: an aiohttp app on its own event loop in a daemon thread (see the package)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from project.sandboxes.server import ThreadedAppServer
from project.sandboxes.whatsapp.rules import DEFAULT_STATUS_DELAYS_MS, Rule, SandboxConfig
from project.sandboxes.whatsapp.validation import BR_MOBILE_RE

logger = logging.getLogger(__name__)


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


class SandboxBase(ThreadedAppServer):
    """The sandbox's state and the helpers every part of it uses (SandboxServer puts them together)."""

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

    async def _read_json(self, request: web.Request) -> dict[str, Any]:
        try:
            data = json.loads(await request.read() or b"{}")
        except (ValueError, RecursionError):  # RecursionError: "[" nested a hundred thousand deep
            raise ValueError("the body must be JSON") from None
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        try:
            # What the sandbox passes on (a webhook, a stored rule) is UTF-8, as Meta's is: a lone
            # surrogate ("\\ud800" in JSON) has no UTF-8 form, and the product's intake refuses it too.
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ValueError(
                "the body contains a lone surrogate (\\ud800 to \\udfff without its pair)"
            ) from None
        return data


def _bearer_token(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer":
        return token.strip()
    # Graph also takes the token as a query parameter.
    return request.query.get("access_token", "")
