"""The sandbox's simulated customer message (`/_sandbox/inbound`): whatever text it is given, it
answers a 2xx or a 4xx with a JSON error, never a 5xx. Text with a lone surrogate has no UTF-8 form
(Meta never sends one, the product's intake refuses it: crm/intake.py) and is refused with 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from project.sandboxes.whatsapp import SandboxServer
from tests.integrations.test_whatsapp_sandbox import SECRET, Receiver

# Any character at all, lone surrogates and control characters over-represented.
ANY_TEXT = st.text(
    alphabet=st.one_of(st.characters(), st.characters(categories=["Cs", "Cc"]), st.sampled_from("😀ção")),
    max_size=200,
)


@pytest.fixture
def inbound() -> Iterator[tuple[httpx.Client, Receiver]]:
    webhook = Receiver()
    with (
        SandboxServer(webhook_url=webhook.url, app_secret=SECRET) as sandbox,
        httpx.Client(base_url=sandbox.url, timeout=60) as http,
    ):
        yield http, webhook
    webhook.close()


def _has_lone_surrogate(value: Any) -> bool:
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in json.dumps(value, ensure_ascii=False))


def test_text_with_a_lone_surrogate_is_refused_with_400_and_nothing_is_posted(inbound) -> None:
    http, webhook = inbound
    response = http.post(
        "/_sandbox/inbound",
        content=b'{"from": "5511999990001", "text": "oi \\ud800"}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert "lone surrogate" in response.json()["error"]
    assert webhook.posts == []
    # A pair of surrogates is one character (😀) and passes on.
    response = http.post(
        "/_sandbox/inbound",
        content=b'{"from": "5511999990001", "text": "oi \\ud83d\\ude00"}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 200 and response.json()["delivered"] is True
    (_, raw), *_ = webhook.posts
    assert json.loads(raw)["entry"][0]["changes"][0]["value"]["messages"][0]["text"]["body"] == "oi 😀"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=ANY_TEXT,
    name=ANY_TEXT,
    kind=st.sampled_from(["text", "button", "image"]) | ANY_TEXT,
    sender=st.sampled_from(["5511999990001", "+5511999990001"]) | ANY_TEXT,
)
@example(text="\ud800", name="", kind="text", sender="5511999990001")
@example(text="\x00", name="\udfff", kind="button", sender="5511999990001")
def test_no_text_makes_the_inbound_control_answer_a_5xx(inbound, text, name, kind, sender) -> None:
    http, _ = inbound
    body = {"from": sender, "text": text, "name": name, "type": kind, "context_id": text}
    response = http.post("/_sandbox/inbound", content=json.dumps(body).encode())
    assert response.status_code in (200, 400), response.text
    answer = response.json()
    if _has_lone_surrogate(body):
        assert response.status_code == 400 and "lone surrogate" in answer["error"]
    elif response.status_code == 200:
        assert answer["wamid"].startswith("wamid.")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=ANY_TEXT.map(lambda text: text.encode("utf-8", "surrogatepass")) | st.binary(max_size=200))
@example(raw=b"[" * 100_000)
@example(raw=b'"\\ud800"')
def test_no_body_makes_the_inbound_control_answer_a_5xx(inbound, raw) -> None:
    http, _ = inbound
    response = http.post("/_sandbox/inbound", content=raw)
    assert response.status_code in (200, 400), response.text
    assert response.headers["Content-Type"].startswith("application/json")
