"""A sandbox standing in for a Linx Millennium server, for tests, the demo and benchmarks.

It answers the two list endpoints the sync uses, with Millennium's shapes: ``{"value": [...]}``,
dates as ``/Date(ms-0300)/``, the ``trans_id`` cursor and ``$top`` page size, Basic auth (401 with
``WWW-Authenticate`` otherwise) and OData-style error bodies:

- ``GET /api/millenium/clientes/lista?$format=json&$top=N&trans_id=T``
- ``GET /api/millenium/pedido_venda/lista?$format=json&$top=N&trans_id=T&filial=CODE
  &data_inicial=ISO&data_final=ISO`` (sales issued in [data_inicial, data_final))

Data is computed, not stored, so any size costs no memory: customer ``i`` (0 <= i < customers) is
a pure function of ``i`` (``cliente`` = 1000 + i, ``trans_id`` = 10 (i + 1)), and each store's sales
of a day are a pure function of (store, day): ``sales_per_day`` of them between 09:00 and 21:00
(-03:00), every tenth without a customer; a sale is served only once its time has come (unless
``future_sales`` is set, to show what a broken ERP clock does). Each customer carries the
opt-in field ``aceita_marketing`` (a boolean or "S"/"N"; one in five says no, one in thirteen
lacks it). Later changes (:meth:`MillenniumSandbox.add_customers`,
:meth:`~MillenniumSandbox.touch_customers`) get fresh trans_ids above every earlier one, as the
ERP's own counter would.

Sales that respond to messages (the demo's "true uplift", off unless ``response_rate`` > 0): a
customer sent a WhatsApp message at time ``t`` buys once more, with probability ``response_rate``,
at ``t`` + between one hour and ``response_days`` days (at one of the stores). Whether and when is a
pure function of (``response_seed``, ``cliente``, ``t`` to the minute), so the same messages give
the same sales; a customer responds at most once a day. The sandbox learns of messages through
:meth:`~MillenniumSandbox.messaged` (or ``POST /_sandbox/messaged`` ``{"messages": [{"to": PHONE,
"at": ISO}]}``), or, with ``responds_to`` (a WhatsApp sandbox's URL, as ``manage.py up`` wires
them), by reading that sandbox's ``GET /_sandbox/messages`` before answering each sales request. A
phone is matched to customer ``i`` by the number the customer record carries (DDD and the last
eight digits). Customers without a message, and those a campaign held out (no message), buy at the
base rate only: that difference is what a campaign's control group measures.

Fault injection (methods, safe from any thread; or ``/_sandbox/config`` over HTTP):
:meth:`~MillenniumSandbox.fail_next` answers the next requests with a 4xx/5xx,
:meth:`~MillenniumSandbox.set_latency` delays every answer (to make a client time out, or slow a
long sync down), ``malformed_every=k`` breaks every k-th record (an invalid CPF, an unreadable
date or a missing id for customers; a non-numeric total, an unreadable date or ``itens`` that is
not a list for sales) while keeping its trans_id. :meth:`~MillenniumSandbox.requests` is the
request log (path, query, status, time of arrival)::

    with MillenniumSandbox(customers=20_000) as erp:
        MillenniumClient(base_url=erp.url, username=DEFAULT_USERNAME, password=DEFAULT_PASSWORD)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import date, datetime, timedelta
from typing import Any

import aiohttp
from aiohttp import web

from integrations.millennium.client import (
    CUSTOMERS_PATH,
    SALES_PATH,
)
from project.sandboxes.millennium_data import FIRST_CUSTOMER_ID, OFFSET, TRANS_STEP, MillenniumData
from project.sandboxes.millennium_records import (
    _BadRequest,
    _json_response,
    _odata_error,
    _trans_id,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MillenniumSandbox(MillenniumData):
    """The sandbox as an aiohttp app on its own event loop in a daemon thread."""

    thread_name = "millennium-sandbox"

    # -- lifecycle ------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get(CUSTOMERS_PATH, self._handle_customers)
        app.router.add_get(SALES_PATH, self._handle_sales)
        app.router.add_get("/_sandbox/config", self._handle_config)
        app.router.add_post("/_sandbox/config", self._handle_config)
        app.router.add_get("/_sandbox/requests", self._handle_requests)
        app.router.add_delete("/_sandbox/requests", self._handle_requests)
        app.router.add_post("/_sandbox/customers", self._handle_customer_changes)
        app.router.add_post("/_sandbox/messaged", self._handle_messaged)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown)
        return app

    # -- thread-safe controls -------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 500, *, after: int = 0) -> None:
        """Let ``after`` API requests through, then answer the next ``n`` with HTTP ``status``."""
        if n < 0 or after < 0 or not 400 <= status <= 599:
            raise ValueError("n and after must be >= 0 and status an HTTP error status (400-599)")

        def apply() -> None:
            self._state.fail_after, self._state.fail_count, self._state.fail_status = after, n, status

        self._on_loop(apply)

    def set_latency(self, ms: float) -> None:
        """Delay every API answer by ``ms`` milliseconds (slow pages, or a client's read timeout)."""
        self._latency_ms = max(float(ms), 0.0)

    def set_future_sales(self, on: bool) -> None:
        """Serve the whole day's sales, those stamped later than now too (an ERP with a wrong clock)."""
        self._future_sales = bool(on)

    def set_malformed_every(self, k: int) -> None:
        """Break every k-th customer and every k-th sale of a store's day (0 = none)."""
        self._malformed_every = max(int(k), 0)

    def requests(self) -> list[dict[str, Any]]:
        """API requests in order of arrival (copies): method, path, params, user, status, at."""
        return self._on_loop(lambda: [dict(r, params=dict(r["params"])) for r in self._state.requests])

    def clear_requests(self) -> None:
        def clear() -> None:
            self._state.requests = []

        self._on_loop(clear)

    def reset(self) -> None:
        """Forget changes, added customers, the request log and pending failures."""

        def clear() -> None:
            self._state = self._fresh_state()

        self._on_loop(clear)

    def add_customers(self, n: int) -> list[int]:
        """Register ``n`` new customers (fresh trans_ids); returns their ``cliente`` ids."""
        return self._on_loop(lambda: self._add(n))

    def touch_customers(self, indexes: Iterable[int]) -> None:
        """Change these customers (their email and name get a version mark) under fresh trans_ids."""
        wanted = list(indexes)
        self._on_loop(lambda: self._touch(wanted))

    @property
    def customer_count(self) -> int:
        return self._base_customers + self._on_loop(lambda: self._state.added)

    def customer_index(self, cliente: int) -> int:
        return int(cliente) - FIRST_CUSTOMER_ID

    def customer_record(self, i: int) -> dict[str, Any]:
        """Customer ``i`` as the API renders it now."""
        return self._on_loop(lambda: self._customer(i))

    def last_trans_id(self) -> int:
        """The largest customer trans_id there is."""

        def last() -> int:
            state = self._state
            return max(state.next_trans_id - 1 if state.changed else 0, TRANS_STEP * self._base_customers)

        return self._on_loop(last)

    def sales_of_day(self, store_code: str, day: date) -> list[dict[str, Any]]:
        """A store's sales of one (local) day, as the API renders them, in trans_id order (the
        regular ones: the responses to messages are `response_sales`)."""
        return [record for record, _ in self._day_sales(store_code, day)]

    def messaged(self, phone: str, at: datetime) -> dict[str, Any] | None:
        """A message reached `phone` at `at`: the sale it makes its customer buy (the record, once
        its time has come it is served with the store's sales), or None (no such customer, no
        response drawn, or the customer responds that day already)."""
        return self._on_loop(lambda: self._messaged(phone, at))

    def response_sales(self) -> list[dict[str, Any]]:
        """Every response sale so far (copies), by store and trans_id."""

        def listed() -> list[dict[str, Any]]:
            by_store = self._state.responses
            return [dict(r) for code in sorted(by_store) for r, _ in sorted(by_store[code], key=_trans_id)]

        return self._on_loop(listed)

    # -- request pipeline (event loop only) -----------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/_sandbox/"):
            return await handler(request)
        state = self._state
        entry: dict[str, Any] = {
            "method": request.method,
            "path": request.path,
            "params": dict(request.query),
            "user": self._user(request),
            "status": None,
            "at": time.time(),
        }
        state.requests.append(entry)
        if self._latency_ms > 0:
            await asyncio.sleep(self._latency_ms / 1000)
        response: web.StreamResponse
        if state.fail_count > 0 and state.fail_after == 0:
            state.fail_count -= 1
            response = _odata_error(state.fail_status, "sandbox: scripted failure")
        else:
            if state.fail_after > 0:
                state.fail_after -= 1
            if not self._authorized(request):
                response = _odata_error(
                    401, "Usuário ou senha inválidos", {"WWW-Authenticate": 'Basic realm="Millennium"'}
                )
            else:
                try:
                    response = await handler(request)
                except _BadRequest as exc:
                    response = _odata_error(400, str(exc))
        entry["status"] = response.status
        return response

    @staticmethod
    def _credentials(request: web.Request) -> tuple[str, str] | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = base64.b64decode(token, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return (user, password) if sep else None

    def _user(self, request: web.Request) -> str:
        credentials = self._credentials(request)
        return credentials[0] if credentials else ""

    def _authorized(self, request: web.Request) -> bool:
        credentials = self._credentials(request)
        if credentials is None:
            return False
        user, password = credentials
        user_ok = hmac.compare_digest(user.encode(), self._username.encode())
        return hmac.compare_digest(password.encode(), self._password.encode()) and user_ok

    def _paging(self, request: web.Request) -> tuple[int, int]:
        query = request.query
        if query.get("$format", "json") != "json":
            raise _BadRequest("$format: only json is supported")
        try:
            top = int(query.get("$top", "100"))
            trans_id = int(query.get("trans_id", "0"))
        except ValueError:
            raise _BadRequest("$top and trans_id must be integers") from None
        if not 1 <= top <= self._max_top or trans_id < 0:
            raise _BadRequest(f"$top must be 1-{self._max_top} and trans_id 0 or more")
        return top, trans_id

    # -- customers (event loop only) ------------------------------------------------------------

    async def _handle_customers(self, request: web.Request) -> web.Response:
        top, trans_id = self._paging(request)
        return _json_response({"value": self._customers_after(trans_id, top)})

    # -- sales (event loop only, or pure) -------------------------------------------------------

    async def _read_messages(self) -> None:
        """The `responds_to` WhatsApp sandbox's messages not read yet, each a chance to respond
        (a failure to read is retried on the next sales request)."""
        if not self._responds_to:
            return
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
                session.get(f"{self._responds_to}/_sandbox/messages") as response,
            ):
                messages = (await response.json())["messages"]
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            return
        state = self._state
        if len(messages) < state.messages_read:  # that sandbox was reset: read again (no duplicates)
            state.messages_read = 0
        for message in messages[state.messages_read :]:
            self._messaged(message["to"], datetime.fromisoformat(message["received_at"]))
        state.messages_read = len(messages)

    @staticmethod
    def _when(value: str, name: str) -> datetime:
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise _BadRequest(f"{name}: not an ISO 8601 date: {value!r}") from None
        return when if when.tzinfo else when.replace(tzinfo=OFFSET)

    async def _handle_sales(self, request: web.Request) -> web.Response:
        top, trans_id = self._paging(request)
        query = request.query
        store_code = query.get("filial", "")
        if not store_code:
            raise _BadRequest("filial is required")
        start = self._when(query.get("data_inicial", ""), "data_inicial")
        end = self._when(query.get("data_final", ""), "data_final")
        if end < start:
            raise _BadRequest("data_final is before data_inicial")
        if end - start > timedelta(days=400):
            raise _BadRequest("the window is longer than 400 days")
        found = []
        day = start.astimezone(OFFSET).date()
        # A sale exists once it has happened: the day's later sales come when their time does.
        until = min(end, datetime.now(OFFSET)) if not self._future_sales else end
        while datetime(day.year, day.month, day.day, tzinfo=OFFSET) < until:
            for record, sold_at in self._day_sales(store_code, day):
                if start <= sold_at < until and record["trans_id"] > trans_id:
                    found.append(record)
            day += timedelta(days=1)
        await self._read_messages()
        for record, sold_at in self._state.responses.get(store_code, []):
            if start <= sold_at < until and record["trans_id"] > trans_id:
                found.append(dict(record))
        found.sort(key=lambda r: r["trans_id"])
        return _json_response({"value": found[:top]})

    # -- controls over HTTP ---------------------------------------------------------------------

    async def _handle_config(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            try:
                data = json.loads(await request.read() or b"{}")
                if not isinstance(data, dict):
                    raise ValueError("a JSON object is expected")
                if "latency_ms" in data:
                    self.set_latency(float(data["latency_ms"]))
                if "malformed_every" in data:
                    self.set_malformed_every(int(data["malformed_every"]))
                if "future_sales" in data:
                    self.set_future_sales(data["future_sales"] is True)
                if "fail_next" in data:
                    rule = data["fail_next"]
                    self._state.fail_after = int(rule.get("after", 0))
                    self._state.fail_count = int(rule.get("n", 1))
                    self._state.fail_status = int(rule.get("status", 500))
            except (TypeError, ValueError, AttributeError) as exc:
                return _json_response({"error": str(exc)}, 400)
        return _json_response(
            {
                "customers": self._base_customers + self._state.added,
                "stores": list(self._stores),
                "sales_per_day": self._sales_per_day,
                "latency_ms": self._latency_ms,
                "malformed_every": self._malformed_every,
                "future_sales": self._future_sales,
                "pending_failures": self._state.fail_count,
            }
        )

    async def _handle_requests(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            self._state.requests = []
        requests = self._state.requests
        return _json_response({"count": len(requests), "requests": requests[-1000:]})

    async def _handle_customer_changes(self, request: web.Request) -> web.Response:
        try:
            data = json.loads(await request.read() or b"{}")
            added = self._add(int(data.get("add", 0)))
            self._touch([int(i) for i in data.get("touch", [])])
        except (TypeError, ValueError, AttributeError) as exc:
            return _json_response({"error": str(exc)}, 400)
        return _json_response({"added": added, "customers": self._base_customers + self._state.added})

    async def _handle_messaged(self, request: web.Request) -> web.Response:
        try:
            data = json.loads(await request.read() or b"{}")
            sales = [
                self._messaged(str(m["to"]), datetime.fromisoformat(str(m["at"])))
                for m in data.get("messages", [])
            ]
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            return _json_response({"error": str(exc)}, 400)
        return _json_response({"sales": [sale for sale in sales if sale]})

    async def _handle_unknown(self, request: web.Request) -> web.Response:
        return _odata_error(404, f"Recurso não encontrado: {request.path}")
