"""Many small POSTs in flight to one origin: an HTTP/1.1 keep-alive pool on asyncio, the WhatsApp
send path's client (integrations.whatsapp.client.GraphClient; made by integrations.http.post_pool).

Why not aiohttp: at Meta's top tier the send path is CPU-bound, and an aiohttp request cost
~170 µs of CPU here (session, request and response objects, URL and header handling, a timer a
request) against ~80 µs for this pool (`benchmarks/http_clients.py`, docs/benchmarks.md). A
request is its bytes written to an idle keep-alive connection; the answer is parsed by httptools
(llhttp, the parser uvicorn uses); one sweep a fraction of a second enforces every deadline.

What it keeps of the outbound seam: every connection goes to addresses that
integrations.outbound.peer_addresses checked (and to no other lookup of the name; TLS still checks
the host's name and certificate); http and https only; no redirect followed (a 3xx is an answer);
answers capped; a connect timeout and an answer deadline. A request that gets no whole answer
raises NotSent (no connection was made: the server cannot have seen it) or NoAnswer (written,
maybe in part: the server may have acted), which integrations.retry classifies.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import httptools

from integrations import outbound

# A request target's characters (RFC 3986 pchar, "/" and a query): nothing that could end the
# request line or start a header.
_TARGET = re.compile(r"/[\w\-.~!$&'()*+,;=:@%/?]*\Z", re.ASCII)
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_BAD_VALUE = re.compile(r"[\r\n\0]")
KEEPALIVE = 15.0  # seconds an idle connection is kept (as aiohttp's default): servers drop idle ones
ADDRESSES_TTL = 10.0  # seconds the host's checked addresses serve new connections (aiohttp's DNS cache)
MAX_HEAD = 64 * 1024  # an answer's status line and headers, at most (the body has `max_body`)


class PoolError(Exception):
    """A request that got no whole answer."""


class NotSent(PoolError):
    """No connection was made (refused, unreachable, name not found, TLS refused, connect timeout):
    the server cannot have seen the request."""


class NoAnswer(PoolError):
    """The request was written (maybe in part) and no whole answer came: the server may have acted."""


class AnswerTimeout(NoAnswer):
    """No whole answer within the pool's `answer_timeout` of the request being written."""


class AnswerTooLarge(NoAnswer):
    """The answer is longer than the pool's `max_body`."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]  # names in lower case
    body: bytes


class PostPool:
    """Up to `limit` keep-alive connections to the origin of `base_url`, on the loop it is used on
    (one loop: create, use and close it there). `post(path, body)` sends to the base URL's path
    followed by `path`."""

    def __init__(
        self,
        base_url: str,
        *,
        limit: int,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = 5.0,
        answer_timeout: float = 20.0,
        max_body: int = 1024 * 1024,
    ) -> None:
        outbound.check_scheme(base_url)
        parts = urlsplit(base_url)
        if not parts.hostname:
            raise outbound.OutboundURLError("The URL names no host.")
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
            raise ValueError("a pool's base URL is an origin and a path: no credentials, query or fragment")
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname
        try:
            ascii_host = self.host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(f"not a host name: {self.host[:100]!r}") from exc
        tls = parts.scheme.lower() == "https"
        self.port = parts.port or (443 if tls else 80)
        self.ssl = (ssl_context or ssl.create_default_context()) if tls else None
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout, self.answer_timeout, self.max_body = connect_timeout, answer_timeout, max_body
        host = f"[{ascii_host}]" if ":" in ascii_host else ascii_host
        default_port = self.port == (443 if tls else 80)
        fixed = {"Host": host if default_port else f"{host}:{self.port}", **(headers or {})}
        self._fixed = _header_lines(fixed)
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[_Connection] = []  # a stack: the connection used last is taken first
        self._busy: set[_Connection] = set()
        self._addresses: tuple[float, asyncio.Future[list[str]]] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None) -> Answer:
        """POST `body` to the base URL's path + `path` (already percent-encoded); the answer, of any
        status. Raises NotSent, NoAnswer, outbound.OutboundURLError (the guard refused the host's
        addresses: nothing was sent) or ValueError (a path or header that cannot be sent)."""
        target = self.prefix + path
        if not _TARGET.match(target):
            raise ValueError(f"not a request target: {target[:100]!r}")
        request = b"".join(
            (
                b"POST %s HTTP/1.1\r\n" % target.encode("ascii"),
                self._fixed,
                _header_lines(headers) if headers else b"",
                b"Content-Length: %d\r\n\r\n" % len(body),
                body,
            )
        )
        if self._closed:
            raise NotSent("the pool is closed")
        async with self._slots:
            connection = await self._connection()
            deadline = asyncio.get_running_loop().time() + self.answer_timeout
            waiter = connection.send(request, deadline=deadline)
            self._sweep_soon()
            try:
                return await waiter
            except BaseException:
                connection.abort()  # no whole answer (or the caller gave up): not reusable
                raise

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for connection in [*self._idle, *self._busy]:
            connection.abort()
        self._idle.clear()

    # -- connections -----------------------------------------------------------------------------

    async def _connection(self) -> _Connection:
        """An idle connection still open and not idle too long, else a new one."""
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()
            if connection.open and now - connection.idle_since < KEEPALIVE:
                return connection
            connection.abort()
        return await self._connect()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        error: Exception | None = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                for address in await self._checked_addresses():
                    try:
                        _, connection = await loop.create_connection(
                            lambda: _Connection(self),
                            address,
                            self.port,
                            ssl=self.ssl,
                            server_hostname=self.host if self.ssl else None,
                        )
                    except OSError as exc:  # ssl.SSLError included
                        error = exc
                        continue
                    return connection
        except TimeoutError:
            raise NotSent(f"timeout connecting to {self.host}:{self.port}") from None
        raise NotSent(f"cannot connect to {self.host}:{self.port}: {error}") from error

    async def _checked_addresses(self) -> list[str]:
        """The addresses a connection may be made to (outbound.peer_addresses, in a thread: it may
        look the name up and read the trusted origins), shared by the connections made within
        ADDRESSES_TTL; a refusal or a failed lookup is not kept."""
        loop = asyncio.get_running_loop()
        if self._addresses is None or loop.time() - self._addresses[0] > ADDRESSES_TTL:
            task = asyncio.ensure_future(asyncio.to_thread(outbound.peer_addresses, self.host, self.port))
            self._addresses = (loop.time(), task)
        try:
            return list(await asyncio.shield(self._addresses[1]))
        except outbound.OutboundURLError:
            self._addresses = None
            raise
        except OSError as exc:
            self._addresses = None
            raise NotSent(f"cannot look up {self.host}: {exc}") from exc

    def _sweep_soon(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """While the pool has connections: answers past their deadline fail (NoAnswer), idle
        connections past KEEPALIVE close. One pass a quarter of the answer timeout (at most a
        second): no timer a request."""
        loop = asyncio.get_running_loop()
        while self._busy or self._idle:
            await asyncio.sleep(min(1.0, self.answer_timeout / 4))
            now = loop.time()
            for connection in [c for c in self._busy if c.deadline < now]:
                connection.fail(AnswerTimeout(f"no answer within {self.answer_timeout:g} s"))
            stale = [c for c in self._idle if now - c.idle_since >= KEEPALIVE or not c.open]
            for connection in stale:
                self._idle.remove(connection)
                connection.abort()

    def _done(self, connection: _Connection, *, reusable: bool) -> None:
        self._busy.discard(connection)
        if reusable and connection.open and not self._closed:
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            connection.abort()

    def _lost(self, connection: _Connection) -> None:
        self._busy.discard(connection)
        with contextlib.suppress(ValueError):
            self._idle.remove(connection)


def _header_lines(headers: Mapping[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if not _HEADER_NAME.match(name) or _BAD_VALUE.search(value):
            raise ValueError(f"a header that cannot be sent: {name[:50]!r}")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self, pool: PostPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Answer] | None = None
        self.deadline = 0.0
        self.idle_since = 0.0
        self._start()

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def _start(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.head_size = 0
        self.headers_done = False
        self.framed = False  # a length or chunks tell where the answer ends (not the connection's end)

    def send(self, request: bytes, *, deadline: float) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.deadline = deadline
        self._start()
        self.pool._busy.add(self)
        self.transport.write(request)
        return self.waiter

    def fail(self, error: PoolError) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)
        self.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self.pool._busy.discard(self)

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.abort()  # bytes nobody asked for: not a connection to reuse
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(NoAnswer(f"malformed answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pool._lost(self)
        if self.waiter is None or self.waiter.done():
            return
        if self.headers_done and not self.framed and not self.pool._closed:
            self._answer(reusable=False)  # an answer that ends with its connection (HTTP/1.0 style)
            return
        reason = f": {exc}" if exc else ""
        self.waiter.set_exception(NoAnswer(f"the connection closed before the whole answer{reason}"))

    # -- httptools' callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.waiter is None:
            self.abort()  # an answer to no request (a second one sent with the first): not reused

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value)
        if self.head_size > MAX_HEAD:
            self.fail(AnswerTooLarge(f"the answer's headers are longer than {MAX_HEAD} bytes"))
            return
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        self.framed = chunked or "content-length" in self.headers or self.status in (204, 304)

    def on_body(self, body: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            return
        self.body += body
        if len(self.body) > self.pool.max_body:
            self.fail(AnswerTooLarge(f"the answer is longer than {self.pool.max_body} bytes"))

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:
            self._start()  # an interim answer (100 Continue, 103): the real one follows
            return
        if self.waiter is not None and not self.waiter.done():
            self._answer(reusable=self.parser.should_keep_alive())

    def _answer(self, *, reusable: bool) -> None:
        assert self.waiter is not None
        waiter, self.waiter = self.waiter, None
        waiter.set_result(Answer(self.status, self.headers, bytes(self.body)))
        self.pool._done(self, reusable=reusable)
