"""The WhatsApp Cloud API sandbox, exercised over real loopback HTTP (no mocks)."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from project.sandboxes.whatsapp import SandboxServer
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
PHONE_NUMBER_ID = "1234567890"
TOKEN = "tok"
SEND_PATH = f"/v21.0/{PHONE_NUMBER_ID}/messages"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "app-secret"

TEMPLATE_MESSAGE: dict[str, Any] = {
    "messaging_product": "whatsapp",
    "recipient_type": "individual",
    "to": "5511999990001",
    "type": "template",
    "template": {
        "name": "promo_novembro",
        "language": {"code": "pt_BR"},
        "components": [
            {
                "type": "header",
                "parameters": [{"type": "image", "image": {"link": "https://example.com/a.jpg"}}],
            },
            {
                "type": "body",
                "parameters": [{"type": "text", "text": "Ana"}, {"type": "text", "text": "20%"}],
            },
            {
                "type": "button",
                "sub_type": "url",
                "index": "0",
                "parameters": [{"type": "text", "text": "r/abc123"}],
            },
        ],
    },
    "biz_opaque_callback_data": "m:123",
}


def message(**changes: Any) -> dict[str, Any]:
    """A deep copy of the template message with top-level keys changed."""
    body = copy.deepcopy(TEMPLATE_MESSAGE)
    body.update(changes)
    return body


@pytest.fixture
def server() -> Iterator[SandboxServer]:
    with SandboxServer(numbers={PHONE_NUMBER_ID: TOKEN}) as sandbox:
        yield sandbox


@pytest.fixture
def client(server: SandboxServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as http:
        yield http


class Receiver:
    """A tiny webhook endpoint on a free port that records every POST (headers and raw body)."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        lock = threading.Lock()
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    posts.append((dict(self.headers), raw))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/webhook"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def statuses(self) -> list[dict[str, Any]]:
        return [
            json.loads(raw)["entry"][0]["changes"][0]["value"]["statuses"][0] for _, raw in list(self.posts)
        ]

    def wait_for(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.posts) < count:
            assert time.monotonic() < deadline, f"only {len(self.posts)} of {count} webhooks arrived"
            time.sleep(0.01)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    webhook = Receiver()
    yield webhook
    webhook.close()


def assert_graph_error(response: httpx.Response, status: int, code: int) -> dict[str, Any]:
    """Assert Meta's error shape and return the inner error object."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error["type"] == "OAuthException"
    assert isinstance(error["message"], str) and error["message"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{10,}", error["fbtrace_id"])
    if code != 190:
        assert error["error_data"]["messaging_product"] == "whatsapp"
        assert isinstance(error["error_data"]["details"], str)
    return error


def test_it_accepts_a_template_and_answers_like_meta_with_unique_wamids(
    server: SandboxServer, client: httpx.Client
) -> None:
    wamids = set()
    for to in ("5511999990001", "+5521999990002", "5511999990001"):
        response = client.post(SEND_PATH, json=message(to=to))
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["messaging_product"] == "whatsapp"
        assert body["contacts"] == [{"input": to, "wa_id": to.lstrip("+")}]
        [sent] = body["messages"]
        assert sent["message_status"] == "accepted"
        assert re.fullmatch(r"wamid\.[A-Za-z0-9+/=]{20,}", sent["id"])
        wamids.add(sent["id"])
    assert len(wamids) == 3

    recorded = client.get("/_sandbox/messages").json()
    assert recorded["count"] == 3
    first = recorded["messages"][0]
    assert first["to"] == "5511999990001"
    assert first["phone_number_id"] == PHONE_NUMBER_ID
    assert first["template"] == TEMPLATE_MESSAGE["template"]
    assert first["biz_opaque_callback_data"] == "m:123"
    assert first["received_at"].startswith("20")
    assert [m["wamid"] for m in recorded["messages"]] == [m["wamid"] for m in server.messages()]
    assert client.get("/_sandbox/messages", params={"to": "5521999990002"}).json()["count"] == 1
    assert len(server.messages(to="+5511999990001")) == 2
    assert client.get("/_sandbox/stats").json()["accepted"] == 3
    assert server.stats()["by_recipient_max"] == 2


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 401, 190),
        ({"Authorization": "Bearer wrong"}, 401, 190),
        ({"Authorization": "Bearer"}, 401, 190),
    ],
    ids=["missing", "unknown", "empty"],
)
def test_it_rejects_a_missing_or_unknown_token_with_190(
    server: SandboxServer, headers: dict[str, str], status: int, code: int
) -> None:
    response = httpx.post(f"{server.url}{SEND_PATH}", json=message(), headers=headers)
    error = assert_graph_error(response, status, code)
    assert error["message"] == "Invalid OAuth access token - Cannot parse access token"
    assert server.stats() == {
        "accepted": 0,
        "rejected": 1,
        "by_recipient_max": 0,
        "webhooks_delivered": 0,
        "webhooks_failed": 0,
        "in_flight": 0,
        "webhooks_pending": 0,
        "in_flight_max": 1,
    }


def test_it_accepts_a_token_only_for_its_own_number_unless_listed_in_tokens() -> None:
    numbers = {"111111": "a", "222222": "b"}
    with (
        SandboxServer(numbers=numbers, tokens={"shared"}) as sandbox,
        httpx.Client(base_url=sandbox.url) as http,
    ):

        def send(number: str, token: str) -> httpx.Response:
            return http.post(
                f"/v21.0/{number}/messages", json=message(), headers={"Authorization": f"Bearer {token}"}
            )

        assert send("111111", "a").status_code == 200
        assert send("999999", "shared").status_code == 200
        # Another number's token: Graph says the object does not exist for it.
        assert assert_graph_error(send("222222", "a"), 400, 100)["error_subcode"] == 33
        assert_graph_error(send("111111", "nope"), 401, 190)


def test_it_accepts_any_non_empty_token_when_no_numbers_or_tokens_are_configured() -> None:
    with SandboxServer() as sandbox:
        ok = httpx.post(
            f"{sandbox.url}/v19.0/42/messages", json=message(), headers={"Authorization": "Bearer x"}
        )
        assert ok.status_code == 200
        assert_graph_error(httpx.post(f"{sandbox.url}/v19.0/42/messages", json=message()), 401, 190)


def test_it_rejects_a_malformed_version_with_unknown_path_components(client: httpx.Client) -> None:
    error = assert_graph_error(client.post(f"/v21/{PHONE_NUMBER_ID}/messages", json=message()), 400, 2500)
    assert "Unknown path components" in error["message"]


def _without_template_name() -> dict[str, Any]:
    body = message()
    del body["template"]["name"]
    return body


def _without_language_code() -> dict[str, Any]:
    body = message()
    body["template"]["language"] = {}
    return body


def _button_without(key: str) -> dict[str, Any]:
    body = message()
    del body["template"]["components"][2][key]
    return body


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (message(messaging_product="sms"), 100),
        ({k: v for k, v in message().items() if k != "messaging_product"}, 100),
        (message(to="1234567"), 100),
        (message(to="5511999990001234"), 100),
        (message(to="55 11 99999-0001"), 100),
        (message(to="++5511999990001"), 100),
        (message(type="text"), 100),
        (_without_template_name(), 100),
        (_without_language_code(), 100),
        (_button_without("sub_type"), 131008),
        (_button_without("index"), 131008),
    ],
    ids=[
        "wrong-product",
        "missing-product",
        "short-to",
        "long-to",
        "formatted-to",
        "double-plus-to",
        "not-a-template",
        "template-without-name",
        "language-without-code",
        "button-without-sub-type",
        "button-without-index",
    ],
)
def test_it_rejects_an_invalid_send_like_meta(client: httpx.Client, body: dict[str, Any], code: int) -> None:
    assert_graph_error(client.post(SEND_PATH, json=body), 400, code)


@pytest.mark.parametrize("component", [0, 1, 2], ids=["header", "body", "button"])
def test_it_rejects_an_empty_text_variable_with_131008(client: httpx.Client, component: int) -> None:
    body = message()
    body["template"]["components"][component]["parameters"] = [{"type": "text", "text": ""}]
    error = assert_graph_error(client.post(SEND_PATH, json=body), 400, 131008)
    assert error["message"] == "(#131008) Required parameter is missing"


def test_it_rejects_an_empty_body_variable_with_131008(client: httpx.Client) -> None:
    body = message()
    body["template"]["components"][1]["parameters"][1] = {"type": "text", "text": "   "}
    assert_graph_error(client.post(SEND_PATH, json=body), 400, 131008)
    assert client.get("/_sandbox/stats").json()["rejected"] == 1


def test_it_rejects_a_variable_with_a_new_line_with_132018(client: httpx.Client) -> None:
    body = message()
    body["template"]["components"][1]["parameters"][0] = {"type": "text", "text": "Ana\nSilva"}
    error = assert_graph_error(client.post(SEND_PATH, json=body), 400, 132018)
    assert "new-line" in error["error_data"]["details"]


@pytest.mark.parametrize(
    "text",
    ["Ana\tSilva", "Ana\r\nSilva", "Ana\rSilva", "Ana\u2028Silva", "Ana     Silva", " " * 5 + "Ana"],
)
def test_it_rejects_what_meta_refuses_in_a_parameter_with_132018(client: httpx.Client, text: str) -> None:
    body = message()
    body["template"]["components"][1]["parameters"][0] = {"type": "text", "text": text}
    assert_graph_error(client.post(SEND_PATH, json=body), 400, 132018)


def test_it_takes_up_to_four_spaces_in_a_row(client: httpx.Client) -> None:
    body = message()
    body["template"]["components"][1]["parameters"][0] = {"type": "text", "text": "Ana    Silva"}
    assert client.post(SEND_PATH, json=body).status_code == 200


def test_a_body_parameter_over_metas_length_limit_is_refused_with_132005(client: httpx.Client) -> None:
    body = message()
    params = body["template"]["components"][1]["parameters"]
    params[0] = {"type": "text", "text": "a" * 1024}
    assert client.post(SEND_PATH, json=body).status_code == 200
    params[0] = {"type": "text", "text": "😀" * 513}  # 1,026 UTF-16 code units
    assert_graph_error(client.post(SEND_PATH, json=body), 400, 132005)
    # With the body as the template's only component the limit is 32,768.
    body["template"]["components"] = [{"type": "body", "parameters": [{"type": "text", "text": "a" * 5000}]}]
    assert client.post(SEND_PATH, json=body).status_code == 200


def test_it_rejects_a_body_that_is_not_json_with_100(client: httpx.Client) -> None:
    response = client.post(SEND_PATH, content=b"{not json", headers={"Content-Type": "application/json"})
    assert_graph_error(response, 400, 100)


def test_a_rule_fails_the_next_times_sends_to_that_recipient_only(
    server: SandboxServer, client: httpx.Client
) -> None:
    rule = client.post("/_sandbox/rules", json={"to": "+5511999990001", "code": 131026, "times": 2})
    assert rule.status_code == 200
    for _ in range(2):
        error = assert_graph_error(client.post(SEND_PATH, json=message()), 400, 131026)
        assert error["message"] == "(#131026) Message undeliverable"
        # Someone else is unaffected while the rule lasts.
        assert client.post(SEND_PATH, json=message(to="5521999990002")).status_code == 200
    assert client.post(SEND_PATH, json=message(to="+5511999990001")).status_code == 200
    assert client.get("/_sandbox/rules").json() == {"rules": []}
    stats = server.stats()
    assert (stats["accepted"], stats["rejected"]) == (3, 2)


@pytest.mark.parametrize(
    ("code", "status"),
    [(4, 429), (80007, 429), (130429, 429), (131056, 429), (190, 401), (1, 500), (131050, 400), (368, 400)],
)
def test_a_rule_answers_meta_s_http_status_for_its_code(
    server: SandboxServer, client: httpx.Client, code: int, status: int
) -> None:
    server.add_rule(to="5511999990001", code=code, times=1)
    error = assert_graph_error(client.post(SEND_PATH, json=message()), status, code)
    assert "Unknown error" not in error["message"]
    assert client.post(SEND_PATH, json=message()).status_code == 200


def test_a_rule_without_times_fails_every_send_and_a_wildcard_applies_to_everyone(
    server: SandboxServer, client: httpx.Client
) -> None:
    server.add_rule(to="*", code=131048)
    for to in ("5511999990001", "5521999990002", "5511999990001"):
        assert_graph_error(client.post(SEND_PATH, json=message(to=to)), 400, 131048)
    assert client.delete("/_sandbox/rules").status_code == 200
    assert client.post(SEND_PATH, json=message()).status_code == 200


def test_a_bare_5xx_rule_answers_a_transient_graph_error(client: httpx.Client) -> None:
    client.post("/_sandbox/rules", json={"to": "5511999990001", "http_status": 503, "times": 1})
    error = assert_graph_error(client.post(SEND_PATH, json=message()), 503, 2)
    assert error["message"] == "Service temporarily unavailable"
    client.post(
        "/_sandbox/rules", json={"to": "5511999990001", "code": 131026, "http_status": 502, "times": 1}
    )
    assert_graph_error(client.post(SEND_PATH, json=message()), 502, 131026)
    assert client.post(SEND_PATH, json=message()).status_code == 200


def test_the_controls_reject_a_bad_rule_or_config_key_with_400(client: httpx.Client) -> None:
    assert client.post("/_sandbox/rules", json={"to": "5511999990001"}).status_code == 400
    assert client.post("/_sandbox/rules", json={"to": "abc", "code": 4}).status_code == 400
    assert client.post("/_sandbox/rules", json={"to": "*", "code": 4, "times": 0}).status_code == 400
    assert client.post("/_sandbox/config", json={"latency": 5}).status_code == 400
    assert client.post("/_sandbox/config", json={"latency_ms": -1}).status_code == 400
    config = client.post("/_sandbox/config", json={"app_secret": "s3cret"}).json()
    assert config["app_secret"] == "********"


def test_deleting_messages_resets_messages_and_stats(server: SandboxServer, client: httpx.Client) -> None:
    client.post(SEND_PATH, json=message())
    client.post(SEND_PATH, json=message(to="5521999990002"))
    assert client.delete("/_sandbox/messages").status_code == 200
    assert client.get("/_sandbox/messages").json() == {"count": 0, "messages": []}
    assert client.get("/_sandbox/stats").json()["accepted"] == 0
    server.add_rule(to="*", code=4)
    server.reset()
    assert server.rules() == []
    assert client.post(SEND_PATH, json=message()).status_code == 200


def test_latency_lets_200_concurrent_requests_overlap(server: SandboxServer) -> None:
    # Overlap is observed, not timed: the sandbox holds every send (a latency no test waits out) until
    # it counts 200 open at once, then a short latency releases them.
    assert server.configure(latency_ms=600_000)["latency_ms"] == 600_000

    # aiohttp's client, not httpx.AsyncClient: httpcore 1.0's pool is quadratic in in-flight requests
    # (200 at once take 2-6 s against this server even with no latency), which would time the client.
    async def burst() -> list[int]:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(
            server.url, connector=connector, headers=AUTH, timeout=timeout
        ) as http:

            async def send(n: int) -> int:
                async with http.post(SEND_PATH, json=message(to=f"55119{n:08d}")) as response:
                    await response.read()
                    return response.status

            return await asyncio.gather(*(send(n) for n in range(200)))

    statuses: list[int] = []
    sender = threading.Thread(target=lambda: statuses.extend(asyncio.run(burst())), daemon=True)
    sender.start()
    wait_for(lambda: server.stats()["in_flight"] == 200, timeout=120, what="200 sends open at once")
    assert server.stats()["accepted"] == 0  # all 200 are held by the latency, none answered
    server.configure(latency_ms=200)  # the waiting sends re-read it: their 200 ms are long over
    sender.join(timeout=120)
    assert statuses == [200] * 200
    stats = server.stats()
    assert (stats["accepted"], stats["by_recipient_max"]) == (200, 1)
    assert (stats["in_flight"], stats["in_flight_max"]) == (0, 200)


def test_drop_ninth_digit_gives_brazilian_mobiles_the_old_wa_id(
    server: SandboxServer, client: httpx.Client
) -> None:
    def wa_id(to: str) -> str:
        return client.post(SEND_PATH, json=message(to=to)).json()["contacts"][0]["wa_id"]

    assert wa_id("5511999990001") == "5511999990001"
    client.post("/_sandbox/config", json={"drop_ninth_digit": True})
    assert wa_id("+5511999990001") == "551199990001"
    assert wa_id("551133330001") == "551133330001"  # a landline has no ninth digit
    assert wa_id("14155550123") == "14155550123"
    # Both spellings reach the same WhatsApp account, so they count as one recipient.
    assert wa_id("551199990001") == "551199990001"
    assert server.stats()["by_recipient_max"] == 2


def _verified_bodies(receiver: Receiver) -> list[dict[str, Any]]:
    bodies = []
    for headers, raw in receiver.posts:
        expected = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-Hub-Signature-256"], expected)
        assert headers["Content-Type"] == "application/json"
        bodies.append(json.loads(raw))
    return bodies


def test_it_posts_signed_sent_delivered_read_statuses_in_order(
    server: SandboxServer, client: httpx.Client, receiver: Receiver
) -> None:
    server.configure(webhook_url=receiver.url, app_secret=SECRET)
    wamid = client.post(SEND_PATH, json=message()).json()["messages"][0]["id"]
    receiver.wait_for(3)
    bodies = _verified_bodies(receiver)
    assert [b["entry"][0]["changes"][0]["value"]["statuses"][0]["status"] for b in bodies] == [
        "sent",
        "delivered",
        "read",
    ]
    body = bodies[1]
    assert body["object"] == "whatsapp_business_account"
    change = body["entry"][0]["changes"][0]
    assert change["field"] == "messages"
    assert change["value"]["messaging_product"] == "whatsapp"
    assert change["value"]["metadata"]["phone_number_id"] == PHONE_NUMBER_ID
    status = change["value"]["statuses"][0]
    assert status["id"] == wamid
    assert status["recipient_id"] == "5511999990001"
    assert status["biz_opaque_callback_data"] == "m:123"
    assert status["timestamp"].isdigit()
    assert status["conversation"]["origin"] == {"type": "marketing"}
    assert status["pricing"]["billable"] is True
    assert status["pricing"]["category"] == "marketing"
    wait_for(lambda: server.stats()["webhooks_pending"] == 0, timeout=120, what="the last callback")
    assert len(receiver.posts) == 3
    assert server.stats()["webhooks_delivered"] == 3


def test_a_webhook_failure_rule_accepts_the_send_and_posts_one_failed_status(
    server: SandboxServer, client: httpx.Client, receiver: Receiver
) -> None:
    client.post("/_sandbox/config", json={"webhook_url": receiver.url, "app_secret": SECRET})
    client.post("/_sandbox/rules", json={"to": "5511999990001", "webhook_failure_code": 131049, "times": 1})
    response = client.post(SEND_PATH, json=message())
    assert response.status_code == 200
    receiver.wait_for(1)
    # Every callback of that send is posted: sent/delivered/read, had they been (wrongly) scheduled.
    wait_for(lambda: server.stats()["webhooks_pending"] == 0, timeout=120, what="the send's callbacks")
    [body] = _verified_bodies(receiver)
    [status] = body["entry"][0]["changes"][0]["value"]["statuses"]
    assert status["status"] == "failed"
    assert status["id"] == response.json()["messages"][0]["id"]
    [error] = status["errors"]
    assert error["code"] == 131049
    assert error["title"] and error["message"] and error["error_data"]["details"]


def test_webhook_failures_are_ignored_and_never_slow_the_send(
    server: SandboxServer, client: httpx.Client
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    server.configure(
        webhook_url=f"http://127.0.0.1:{dead_port}/hook", app_secret=SECRET, status_delays_ms=[0]
    )
    for _ in range(3):
        assert client.post(SEND_PATH, json=message()).status_code == 200
    wait_for(lambda: server.stats()["webhooks_failed"] >= 3, timeout=120, what="3 failed callbacks")
    assert client.post(SEND_PATH, json=message()).status_code == 200


def test_the_helpers_are_safe_to_call_from_other_threads_while_serving(
    server: SandboxServer, client: httpx.Client
) -> None:
    errors: list[BaseException] = []

    def poke() -> None:
        try:
            for _ in range(50):
                server.messages()
                server.stats()
        except (RuntimeError, TimeoutError) as exc:
            errors.append(exc)

    threads = [threading.Thread(target=poke) for _ in range(4)]
    for thread in threads:
        thread.start()
    for n in range(50):
        assert client.post(SEND_PATH, json=message(to=f"55219{n:08d}")).status_code == 200
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(server.messages()) == 50


def test_the_management_command_serves_until_sigterm() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LANGUAGE_CODE": "en"}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "whatsapp_sandbox",
            "--port",
            str(port),
            "--token",
            "cmd-tok",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        output = []
        for line in proc.stdout:
            output.append(line)
            if "listening on" in line:
                break
        assert f"listening on http://127.0.0.1:{port}" in output[-1], "".join(output)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v21.0/555/messages",
            json=message(),
            headers={"Authorization": "Bearer cmd-tok"},
        )
        assert response.status_code == 200
        assert_graph_error(
            httpx.post(f"http://127.0.0.1:{port}/v21.0/555/messages", json=message()), 401, 190
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
