"""What a send puts on the wire from an operator's fields: the number's id is one path segment
whatever it holds (never another Graph endpoint), and a token that cannot travel in a header stops
the number's sends without a request."""

from __future__ import annotations

import asyncio
from urllib.parse import unquote

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crm import aio
from integrations import http
from integrations.clients import graph_client
from integrations.whatsapp.client import GraphClient, SendResult, text_payload
from integrations.whatsapp.errors import Action
from project.sandboxes.server import ThreadedAppServer


class Recording(ThreadedAppServer):
    """Accepts every request and keeps its raw path and Authorization header."""

    thread_name = "graph-recording"

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, str]] = []
        self.answer: tuple[int, bytes] | None = None  # (status, body) instead of a send's success

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", r"/{tail:[\s\S]*}", self._answer)  # any path, line breaks too
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        self.requests.append((request.raw_path, request.headers.get("Authorization", "")))
        if self.answer is not None:
            status, body = self.answer
            return web.Response(status=status, body=body, content_type="application/json")
        return web.json_response({"messages": [{"id": "wamid.1"}], "contacts": [{"wa_id": "5511"}]})


@pytest.fixture(scope="module")
def graph():
    with Recording() as server:
        yield server


def _send(base_url: str, *, phone_number_id: str, token: str) -> SendResult:
    async def send() -> SendResult:
        async with http.post_pool(base_url) as pool:
            client = GraphClient(pool=pool, version="v21.0")
            payload = text_payload(to="5511", text="oi")
            return await client.send_payload(
                phone_number_id=phone_number_id, access_token=token, payload=payload
            )

    return asyncio.run(send())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(phone_number_id=st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=64))
def test_the_numbers_id_is_one_path_segment_whatever_it_holds(graph, settings, phone_number_id):
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = True
    graph.requests.clear()
    result = _send(f"{graph.url}/graph/", phone_number_id=phone_number_id, token="t")
    assert result.error is None and result.wamid == "wamid.1"
    ((path, auth),) = graph.requests
    assert path.startswith("/graph/v21.0/") and path.endswith("/messages")
    segment = path.removeprefix("/graph/v21.0/").removesuffix("/messages")
    assert "/" not in segment and "?" not in segment and "#" not in segment
    assert unquote(segment) == phone_number_id
    assert auth == "Bearer t"


def test_an_id_with_a_lone_surrogate_pauses_the_number_and_sends_nothing(graph, settings):
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = True
    graph.requests.clear()
    result = _send(graph.url, phone_number_id="12\udc803", token="t")
    assert result.error is not None and result.action == Action.PAUSE_NUMBER
    assert graph.requests == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    token=st.builds(
        lambda a, c, b: a + c + b,
        st.text(max_size=20),
        st.sampled_from(["\r", "\n", "\r\n", "\x00"]),
        st.text(max_size=20),
    )
)
def test_a_token_that_cannot_travel_in_a_header_pauses_the_number_and_sends_nothing(graph, settings, token):
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = True
    graph.requests.clear()
    result = _send(graph.url, phone_number_id="123", token=token)
    assert result.error is not None and not result.error.retryable
    assert result.action == Action.PAUSE_NUMBER
    assert graph.requests == []


@pytest.mark.parametrize(
    "make_url",
    [
        lambda url: url.replace("http://", "http://user:secret@"),  # credentials
        lambda url: f"{url}/graph?x=1",  # a query
        lambda url: f"{url}/graph#f",  # a fragment
        lambda url: url.rsplit(":", 1)[0] + ":99999",  # a port out of range
    ],
    ids=["credentials", "query", "fragment", "port"],
)
def test_a_graph_url_the_pool_cannot_post_to_pauses_the_number_and_sends_nothing(graph, settings, make_url):
    # The number's graph_url is an operator's text (a URLField takes all of these): the process's
    # client for it refuses every send with the reason, and the send path pauses the number.
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = True
    graph.requests.clear()
    client = graph_client(make_url(graph.url))
    payload = text_payload(to="5511", text="oi")
    result = aio.run(client.send_payload(phone_number_id="123", access_token="t", payload=payload))
    assert result.error is not None and not result.error.retryable
    assert result.action == Action.PAUSE_NUMBER and "request not sent" in str(result.error)
    assert graph.requests == []


@pytest.mark.parametrize("status", [200, 400, 500])
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b"NaN",
        b"null",
        b'"text"',
        b'{"messages": [{"id": null}]}',
        b'{"messages": {"0": {"id": "wamid.1"}}}',
        b'{"messages": [{"id": "wamid.\\u0000"}]}',
        b'{"messages": [{"id": "' + b"w" * 129 + b'"}]}',
        b"\x00\xff",
    ],
    ids=lambda body: repr(body[:40]),
)
def test_any_answer_is_a_result_never_an_exception(graph, settings, status, body):
    # A Graph URL is an operator's (or a proxy answers): whatever comes back, the send has a result
    # (a body nested past the parser's recursion limit included), as for any provider error.
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = True
    graph.answer = (status, body)
    try:
        result = _send(graph.url, phone_number_id="123", token="t")
    finally:
        graph.answer = None
    assert result.error is not None and result.error.status == status


@pytest.mark.parametrize(
    "contacts",
    ['[{"wa_id": 5511}]', '[{"wa_id": "' + "9" * 21 + '"}]', '["x"]', "null", '[{"wa_id": "1\\u0000"}]'],
)
def test_an_accepted_send_keeps_its_wamid_whatever_the_contacts_say(graph, settings, contacts):
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = True
    graph.answer = (200, f'{{"messages": [{{"id": "wamid.1"}}], "contacts": {contacts}}}'.encode())
    try:
        result = _send(graph.url, phone_number_id="123", token="t")
    finally:
        graph.answer = None
    assert result.ok and (result.wamid, result.wa_id) == ("wamid.1", "")
