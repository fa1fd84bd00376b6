"""The send path's POST pool (integrations.http_pool) against real loopback servers: keep-alive,
every way an answer can be framed or broken, deadlines, TLS, and what it refuses to send."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from integrations import http, http_pool
from integrations.http_pool import AnswerTooLarge, NoAnswer, NotSent, PostPool
from tests.tls import self_signed

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@pytest.fixture(autouse=True)
def _loopback(settings):
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = True  # the guard's own tests: test_outbound*.py


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One request's head and body, or None when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
    body = await reader.readexactly(int(length.group(1))) if length else b""
    return head, body


class Server:
    """A loopback server on the test's loop: `handler` serves each connection (by default every
    request on a keep-alive connection gets `answer`). Counts the connections, keeps the requests."""

    def __init__(
        self, handler: Handler | None = None, *, answer: bytes = OK, tls: ssl.SSLContext | None = None
    ):
        self.handler, self.answer, self.tls = handler or self._answering, answer, tls
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []

    async def __aenter__(self) -> Server:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _answering(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            self.requests.append(request)
            writer.write(self.answer)
            await writer.drain()


def run(coro: Awaitable[object]) -> object:
    return asyncio.run(asyncio.wait_for(coro, 60))  # a hang guard, never a measure


def serving(answer: bytes, test: Callable[[Server], Awaitable[object]]) -> object:
    async def main() -> object:
        async with Server(answer=answer) as server:
            return await test(server)

    return run(main())


def test_requests_share_keep_alive_connections_up_to_the_limit():
    async def test(server: Server) -> None:
        async with PostPool(server.url + "/v23.0", limit=4) as pool:
            answers = await asyncio.gather(
                *(pool.post(f"/{i}/messages", b'{"n": %d}' % i) for i in range(200))
            )
        assert {a.status for a in answers} == {200} and {a.body for a in answers} == {b"{}"}
        assert 1 <= server.connections <= 4
        heads = sorted(head.split(b" ")[1] for head, _ in server.requests)
        assert heads == sorted(b"/v23.0/%d/messages" % i for i in range(200))
        assert sorted(body for _, body in server.requests) == sorted(b'{"n": %d}' % i for i in range(200))

    serving(OK, test)


def test_a_host_name_beyond_ascii_travels_as_idna():
    pool = PostPool("https://gráfico.example/v23.0", limit=1)
    assert pool._fixed.startswith(b"Host: xn--grfico-qta.example\r\n")
    with pytest.raises(ValueError):
        PostPool("https://a..b" + "x" * 70 + ".example/", limit=1)


def test_the_request_carries_the_pools_and_the_requests_headers():
    async def test(server: Server) -> None:
        async with http.post_pool(server.url) as pool:
            await pool.post(
                "/x", b"{}", {"Authorization": "Bearer t0k3n", "Content-Type": "application/json"}
            )
        head = server.requests[0][0].decode()
        assert head.startswith("POST /x HTTP/1.1\r\n")
        assert f"\r\nHost: 127.0.0.1:{server.port}\r\n" in head
        assert "\r\nUser-Agent: crm-queue-platform/" in head and "\r\nAuthorization: Bearer t0k3n\r\n" in head
        assert "\r\nContent-Length: 2\r\n" in head

    serving(OK, test)


@pytest.mark.parametrize(
    "answer",
    [
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{"a\r\n4\r\n": 1\r\n1\r\n}\r\n0\r\n\r\n',
        b'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{"a": 1}',
        b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\n{"a": 1}',
        b'HTTP/1.0 200 OK\r\n\r\n{"a": 1}',  # ends with its connection
    ],
)
def test_every_framing_of_an_answer_reads_the_same(answer):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        if b"Content-Length" not in answer and b"chunked" not in answer:
            writer.close()

    async def main() -> None:
        async with Server(handler) as server, PostPool(server.url, limit=2) as pool:
            answer = await pool.post("/", b"{}")
            assert (answer.status, answer.body) == (200, b'{"a": 1}')

    run(main())


def test_a_connection_the_server_closes_is_not_reused():
    async def main() -> None:
        closing = OK.replace(b"Content-Length: 2", b"Content-Length: 2\r\nConnection: close")
        async with Server(answer=closing) as server, PostPool(server.url, limit=1) as pool:
            for _ in range(3):
                assert (await pool.post("/", b"{}")).status == 200
            assert server.connections == 3

    run(main())


def test_an_idle_connection_dropped_by_the_server_is_replaced():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)  # keep-alive promised, then dropped (a server's idle timeout)
        await writer.drain()

    async def main() -> None:
        async with Server(handler) as server, PostPool(server.url, limit=1) as pool:
            assert (await pool.post("/", b"{}")).status == 200
            while pool._idle:  # the pool notices the close
                await asyncio.sleep(0.01)
            assert (await pool.post("/", b"{}")).status == 200
            assert server.connections == 2

    run(main())


def test_no_connection_is_not_sent_and_a_broken_answer_is_no_answer():
    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.Event().wait()

    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"mess')
        await writer.drain()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        await writer.drain()

    async def main() -> None:
        async with Server(never_answers) as silent:
            port = silent.port
            async with PostPool(silent.url, limit=1, answer_timeout=0.2) as pool:
                with pytest.raises(NoAnswer, match="no answer within"):
                    await pool.post("/", b"{}")
        with pytest.raises(NotSent):  # the server is gone: nothing listens on its port
            async with PostPool(f"http://127.0.0.1:{port}", limit=1) as pool:
                await pool.post("/", b"{}")
        for handler in (half, garbage):
            async with Server(handler) as server, PostPool(server.url, limit=1) as pool:
                with pytest.raises(NoAnswer):
                    await pool.post("/", b"{}")

    run(main())


def test_an_answer_past_the_cap_is_refused():
    big = b"HTTP/1.1 200 OK\r\nContent-Length: 300000\r\n\r\n" + b"x" * 300_000

    async def test(server: Server) -> None:
        async with PostPool(server.url, limit=1, max_body=200_000) as pool:
            with pytest.raises(AnswerTooLarge):
                await pool.post("/", b"{}")
        async with PostPool(server.url, limit=1, max_body=300_000) as pool:
            assert len((await pool.post("/", b"{}")).body) == 300_000

    serving(big, test)


def test_endless_headers_are_refused():
    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(10_000):  # 10,000 headers of 40 bytes, and never the end of them
            writer.write(b"X-Filler-%05d: %s\r\n" % (i, b"y" * 24))
            await writer.drain()
        await asyncio.Event().wait()

    async def main() -> None:
        async with Server(flood) as server, PostPool(server.url, limit=1) as pool:
            with pytest.raises(AnswerTooLarge, match="headers"):
                await pool.post("/", b"{}")

    run(main())


def test_an_answer_nobody_asked_for_closes_its_connection():
    async def twice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            writer.write(OK + OK.replace(b"{}", b"[]"))  # a second answer, to no request
            await writer.drain()

    async def main() -> None:
        async with Server(twice) as server, PostPool(server.url, limit=1) as pool:
            for _ in range(3):
                assert (await pool.post("/", b"{}")).body == b"{}"
            assert server.connections == 3

    run(main())


def test_a_cancelled_request_leaves_the_pool_working():
    async def main() -> None:
        gate = asyncio.Event()

        async def slow_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while (request := await read_request(reader)) is not None:
                if request[1] == b"slow":
                    await gate.wait()
                writer.write(OK)
                await writer.drain()

        async with Server(slow_once) as server, PostPool(server.url, limit=1) as pool:
            slow = asyncio.ensure_future(pool.post("/", b"slow"))
            while server.connections == 0:
                await asyncio.sleep(0.01)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            assert (await pool.post("/", b"fast")).status == 200  # a fresh connection: no stale answer read

    run(main())


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/x HTTP/1.1\r\nX-Injected: 1\r\n\r\n", {}),
        ("/a b", {}),
        ("x", {}),
        ("/ok", {"Authorization": "Bearer a\r\nX-Injected: 1"}),
        ("/ok", {"Authorization": "Bearer a\nb"}),
        ("/ok", {"Bad Name": "v"}),
        ("/ok", {"X": "a\0b"}),
    ],
)
def test_a_path_or_header_that_would_split_the_request_is_refused_unsent(path, headers):
    async def test(server: Server) -> None:
        async with PostPool(server.url, limit=1) as pool:
            with pytest.raises(ValueError):
                await pool.post(path, b"{}", headers)
        assert server.connections == 0

    serving(OK, test)


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.text(max_size=40), value=st.text(max_size=40))
def test_whatever_the_path_and_header_the_server_reads_exactly_them_or_nothing_is_sent(path, value):
    async def test(server: Server) -> None:
        async with PostPool(server.url, limit=1) as pool:
            try:
                await pool.post("/" + path, b"{}", {"X-Value": value})
            except (ValueError, UnicodeEncodeError):
                assert server.requests == []
                return
        [(head, body)] = server.requests
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0] == f"POST /{path} HTTP/1.1" and body == b"{}"
        assert [line for line in lines if line.startswith("X-Value:")] == [f"X-Value: {value}"]

    serving(OK, test)


@hsettings(max_examples=80, deadline=None)
@given(answer=st.binary(max_size=300) | st.builds(lambda b: OK[:30] + b, st.binary(max_size=200)))
def test_whatever_a_server_answers_the_pool_returns_an_answer_or_raises_its_own_errors(answer):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    async def main() -> None:
        async with Server(handler) as server, PostPool(server.url, limit=1, answer_timeout=5) as pool:
            try:
                result = await pool.post("/", b"{}")
            except http_pool.PoolError:
                return
            assert 100 <= result.status <= 999 and isinstance(result.body, bytes)

    run(main())


def test_tls_checks_the_servers_certificate(tmp_path):
    cert, serving_tls = self_signed(tmp_path)
    trusting = ssl.create_default_context(cadata=cert)

    async def main() -> None:
        async with Server(tls=serving_tls) as server:
            async with PostPool(server.url, limit=1, ssl_context=trusting) as pool:
                assert (await pool.post("/", b"{}")).status == 200
            async with http.post_pool(server.url) as pool:  # the seam's CA bundle does not know it
                with pytest.raises(NotSent, match="CERTIFICATE_VERIFY_FAILED"):
                    await pool.post("/", b"{}")
            assert len(server.requests) == 1

    run(main())


ANY_TEXT = ["Olá, João! Até já 👍", "a lone \udc80 surrogate", "\x00\u2028 line separators"]
META_OK = b'{"contacts":[{"wa_id":"5511"}],"messages":[{"id":"wamid.1"}]}'


@pytest.mark.parametrize("text", ANY_TEXT)
def test_the_graph_client_sends_any_text_as_ascii_json(text):
    """A reply typed anywhere (a Chatwoot webhook's JSON may carry a lone surrogate) reaches Meta as
    JSON that reads back as the same text: nothing is refused or lost on the way."""
    from integrations.whatsapp.client import GraphClient

    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(META_OK), META_OK)

    async def test(server: Server) -> None:
        async with PostPool(server.url, limit=1) as pool:
            graph = GraphClient(pool=pool, version="v23.0")
            sent = await graph.send_text(phone_number_id="123", access_token="t", to="5511", text=text)
        assert sent.ok and sent.wamid == "wamid.1"
        [(head, body)] = server.requests
        assert head.startswith(b"POST /v23.0/123/messages HTTP/1.1\r\n") and body.isascii()
        assert json.loads(body)["text"]["body"] == text

    serving(answer, test)
