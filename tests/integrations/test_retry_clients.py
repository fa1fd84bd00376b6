"""Every outbound client classifies through integrations.retry: over loopback, the same answer (a
status, a Retry-After, no answer at all) means the same thing to each of them."""

from __future__ import annotations

import asyncio
import socket
from email.message import EmailMessage as MimeMessage

import httpx
import pytest
from aiohttp import web

from integrations import http_pool
from integrations.chatwoot.client import ChatwootClient
from integrations.email import esp
from integrations.email.bounces import Failure
from integrations.errors import IntegrationError
from integrations.millennium.client import MillenniumClient
from integrations.runner import client as runner_client
from integrations.runner.contract import ItemIn
from integrations.whatsapp.client import GraphClient, SendResult, TemplateMessage
from integrations.whatsapp.errors import Action
from project.sandboxes.server import ThreadedAppServer

SHORT = httpx.Timeout(connect=2.0, read=0.3, write=2.0, pool=2.0)


class Answering(ThreadedAppServer):
    """Answers every request with the status and headers set, after `delay` seconds."""

    thread_name = "retry-sandbox"

    def __init__(self) -> None:
        super().__init__()
        self.status = 200
        self.headers: dict[str, str] = {}
        self.body: object = {}
        self.delay = 0.0

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.json_response(self.body, status=self.status, headers=self.headers)


@pytest.fixture
def server():
    with Answering() as s:
        yield s


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there once the socket is closed


def _millennium(url: str) -> IntegrationError:
    with (
        MillenniumClient(base_url=url, username="u", password="p", timeout=0.3) as erp,
        pytest.raises(IntegrationError) as failure,
    ):
        erp.list_values("/api/millenium/clientes/lista", {}, top=1)
    return failure.value


def _chatwoot_post(url: str) -> IntegrationError:
    with (
        ChatwootClient(base_url=url, account_id=1, api_token="t", timeout=SHORT) as chatwoot,
        pytest.raises(IntegrationError) as failure,
    ):
        chatwoot.message_create(conversation_id=1, content="oi", private=True)
    return failure.value


def _chatwoot_get(url: str) -> IntegrationError:
    with (
        ChatwootClient(base_url=url, account_id=1, api_token="t", timeout=SHORT) as chatwoot,
        pytest.raises(IntegrationError) as failure,
    ):
        chatwoot.conversation_find_or_create(contact_id=1, source_id=None, inbox_id=1)
    return failure.value


def _produce(url: str) -> IntegrationError:
    with pytest.raises(IntegrationError) as failure:
        runner_client.produce(url, {"cursor": None})
    return failure.value


def _whatsapp(url: str, *, read_timeout: float = 20.0) -> SendResult:
    async def send() -> SendResult:
        async with http_pool.PostPool(url, limit=4, connect_timeout=2.0, answer_timeout=read_timeout) as pool:
            graph = GraphClient(pool=pool, version="v21.0")
            return await graph.send_template(
                phone_number_id="1",
                access_token="t",
                message=TemplateMessage(to="5511987654321", template="oferta", language="pt_BR"),
            )

    return asyncio.run(send())


@pytest.mark.parametrize("status", [408, 425, 429, 500, 503])
def test_a_retryable_answer_is_retryable_everywhere_with_its_retry_after(server, status):
    server.status, server.headers, server.body = status, {"Retry-After": "7"}, {"error": "later"}
    for error in (_millennium(server.url), _chatwoot_post(server.url), _produce(server.url)):
        assert (error.retryable, error.status, error.retry_after) == (True, status, 7.0)
    sent = _whatsapp(server.url)
    assert (sent.action, sent.retry_after, sent.maybe_accepted) == (Action.RETRY, 7.0, False)
    assert sent.error is not None and sent.error.retryable
    [outcome] = runner_client.process(
        server.url, [ItemIn(item_id=1, execution_id=1, external_id="e1", payload={}, attempt=1)]
    )
    assert outcome.retryable and not outcome.ok


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_any_other_4xx_is_final_everywhere(server, status):
    server.status, server.headers = status, {"Retry-After": "7"}
    for error in (_millennium(server.url), _chatwoot_post(server.url), _produce(server.url)):
        assert (error.retryable, error.status, error.retry_after) == (False, status, None)
    sent = _whatsapp(server.url)
    assert sent.action is Action.DROP_RECIPIENT and sent.retry_after is None
    assert sent.error is not None and not sent.error.retryable


def test_meta_error_codes_still_come_first(server):
    server.status, server.body = 400, {"error": {"code": 130429, "message": "throughput reached"}}
    assert _whatsapp(server.url).action is Action.THROTTLED
    server.status, server.body = 503, {"error": {"code": 131026, "message": "undeliverable"}}
    assert _whatsapp(server.url).action is Action.DROP_RECIPIENT


def test_a_request_that_went_out_unanswered_is_maybe_delivered_unless_idempotent(server):
    server.delay = 3.0  # every client gives up after 0.3 s of reading
    posted = _chatwoot_post(server.url)
    assert posted.retryable and posted.maybe_delivered and "timed out" in str(posted)
    read = _chatwoot_get(server.url)
    assert read.retryable and not read.maybe_delivered
    erp = _millennium(server.url)
    assert erp.retryable and not erp.maybe_delivered
    sent = _whatsapp(server.url, read_timeout=0.3)
    assert sent.action is Action.RETRY and sent.maybe_accepted  # campaigns.whatsapp: UNKNOWN, never resent


def test_a_connection_never_made_is_retryable_and_not_delivered():
    url = _closed_port_url()
    for error in (_millennium(url), _chatwoot_post(url), _produce(url)):
        assert error.retryable and not error.maybe_delivered and error.status is None
    sent = _whatsapp(url)
    assert sent.action is Action.RETRY and not sent.maybe_accepted
    [outcome] = runner_client.process(
        url, [ItemIn(item_id=1, execution_id=1, external_id="e1", payload={}, attempt=1)]
    )
    assert outcome.retryable and outcome.error.startswith("unreachable")


def _esp(url: str, *, timeout: float = 5.0) -> esp.EspResult:
    message = MimeMessage()
    message["From"], message["To"], message["Subject"] = "ofertas@loja.example.com.br", "c@example.com", "Oi"
    message.set_content("Olá")
    return esp.send(provider="postmark", api_key="token", api_url=url + "/", message=message, timeout=timeout)


@pytest.mark.parametrize("status", [408, 425, 429, 503])
def test_the_esp_path_follows_the_same_rule(server, status):
    server.status, server.headers, server.body = (
        status,
        {"Retry-After": "7"},
        {"ErrorCode": 1, "Message": "later"},
    )
    result = _esp(server.url)
    assert result.transient.startswith(str(status)) and result.retry_after == 7.0
    assert not (result.failure or result.unknown or result.sent)

    server.status = 422
    result = _esp(server.url)
    assert result.failure is not None and result.failure.kind is Failure.SENDER
    assert not (result.transient or result.unknown) and result.retry_after is None


def test_the_esp_path_tells_a_request_never_sent_from_one_unanswered(server):
    result = _esp(_closed_port_url())
    assert result.transient and not (result.unknown or result.failure)
    server.delay = 3.0
    result = _esp(server.url, timeout=0.3)
    assert result.unknown.startswith("Postmark: no answer after the request was sent")
    assert not (result.transient or result.failure)
