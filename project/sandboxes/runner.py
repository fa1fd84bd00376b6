"""A loopback stand-in for an HTTP integration handler (docs/runner-http-contract.md).

Implements ``POST /process``, ``POST /process-batch`` and ``POST /produce`` with injectable
failures, for tests, the demo and benchmarks::

    with HandlerSandbox(token="Bearer s3cret") as server:
        server.fail_next(2, status=503)           # the next two requests answer 503
        server.fail_item("ext-7", times=2)        # ext-7 fails twice (retryable), then succeeds
        server.reject_item("ext-9", "bad data")   # ext-9 fails for good (permanent)
        server.set_latency(0.05)
        server.produce_items = [{"external_id": "a", "payload": {}}]
        ...
        server.calls["/process"], server.max_concurrency, server.processed

Every control is safe from any thread (state is touched on the server's loop only).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from aiohttp import web

from project.sandboxes.server import ThreadedAppServer


class HandlerSandbox(ThreadedAppServer):
    thread_name = "runner-handler-sandbox"
    backlog = 1024

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, token: str = "") -> None:
        super().__init__(host, port)
        self.token = token  # the Authorization value required (empty: none)
        self.calls: Counter[str] = Counter()
        self.processed: list[str] = []  # external ids answered ok, in order
        self.concurrency = 0
        self.max_concurrency = 0
        self.latency = 0.0
        self.produce_items: list[dict[str, Any]] = []
        self._fail_next: list[int] = []
        self._item_failures: dict[str, int] = {}
        self._item_rejects: dict[str, str] = {}

    # --- controls ---------------------------------------------------------------------------
    def fail_next(self, n: int, *, status: int = 503) -> None:
        self._on_loop(lambda: self._fail_next.extend([status] * n))

    def fail_item(self, external_id: str, *, times: int) -> None:
        """The item fails `times` times with a retryable error, then succeeds."""
        self._on_loop(lambda: self._item_failures.__setitem__(external_id, times))

    def reject_item(self, external_id: str, error: str = "rejected") -> None:
        """The item fails every time with a permanent error."""
        self._on_loop(lambda: self._item_rejects.__setitem__(external_id, error))

    def set_latency(self, seconds: float) -> None:
        self._on_loop(lambda: setattr(self, "latency", seconds))

    def reset(self) -> None:
        def _do() -> None:
            self.calls.clear()
            self.processed.clear()
            self.max_concurrency = 0
            self._fail_next.clear()
            self._item_failures.clear()
            self._item_rejects.clear()
            self.latency = 0.0

        self._on_loop(_do)

    # --- the app ----------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/process", self._process)
        app.router.add_post("/process-batch", self._process_batch)
        app.router.add_post("/produce", self._produce)
        return app

    def _item_result(self, item: dict[str, Any]) -> dict[str, Any]:
        ext = str(item.get("external_id", ""))
        if ext in self._item_rejects:
            return {
                "item_id": item.get("item_id"),
                "status": "error",
                "error": self._item_rejects[ext],
                "retryable": False,
            }
        if self._item_failures.get(ext, 0) > 0:
            self._item_failures[ext] -= 1
            return {
                "item_id": item.get("item_id"),
                "status": "error",
                "error": "try again",
                "retryable": True,
            }
        self.processed.append(ext)
        return {"item_id": item.get("item_id"), "status": "ok", "result": {"echo": ext}}

    async def _enter(self, request: web.Request) -> web.Response | None:
        self.calls[request.path] += 1
        if self.token and request.headers.get("Authorization") != self.token:
            return web.json_response({"error": "unauthorized"}, status=401)
        if self._fail_next:
            status = self._fail_next.pop(0)
            return web.json_response({"error": f"injected {status}"}, status=status)
        return None

    async def _around(self, request: web.Request, body: Any) -> Any:
        self.concurrency += 1
        self.max_concurrency = max(self.max_concurrency, self.concurrency)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            return body
        finally:
            self.concurrency -= 1

    async def _process(self, request: web.Request) -> web.Response:
        refused = await self._enter(request)
        if refused is not None:
            return refused
        item = await request.json()
        await self._around(request, None)
        result = self._item_result(item)
        if result["status"] == "ok":
            return web.json_response({"status": "ok", "result": result["result"]})
        status = 503 if result["retryable"] else 422
        return web.json_response({"error": result["error"], "retryable": result["retryable"]}, status=status)

    async def _process_batch(self, request: web.Request) -> web.Response:
        refused = await self._enter(request)
        if refused is not None:
            return refused
        body = await request.json()
        await self._around(request, None)
        return web.json_response({"results": [self._item_result(i) for i in body.get("items", [])]})

    async def _produce(self, request: web.Request) -> web.Response:
        refused = await self._enter(request)
        if refused is not None:
            return refused
        body = await request.json()
        start = int(body.get("cursor") or 0)
        page = self.produce_items[start : start + 500]
        nxt = start + 500 if start + 500 < len(self.produce_items) else None
        return web.Response(
            text=json.dumps({"items": page, "next_cursor": nxt}), content_type="application/json"
        )
