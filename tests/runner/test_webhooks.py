from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from runner.models import Execution, ExecutionItem, Handler
from runner.views import signature

SECRET = "whsec-test-0123456789"


def _hmac_handler(py_handler: Handler) -> Handler:
    py_handler.webhook_auth = Handler.WebhookAuth.HMAC
    py_handler.set_webhook_secret(SECRET)
    py_handler.save()
    return py_handler


def _post(client, body: bytes, **headers):
    return client.post("/hooks/crm-x/leads", data=body, content_type="application/json", headers=headers)


def test_a_signed_webhook_is_stored_as_an_item_and_answered_202(client, py_handler):
    _hmac_handler(py_handler)
    body = json.dumps({"id": "evt-1", "lead": "Ana"}).encode()
    response = _post(client, body, **{"X-Runner-Signature": signature(SECRET, body)})
    assert response.status_code == 202
    item = ExecutionItem.objects.select_related("execution").get()
    assert item.external_id == "evt-1" and item.payload == {"id": "evt-1", "lead": "Ana"}
    assert item.execution.trigger == "webhook" and item.execution.status == "running"


def test_a_bad_or_missing_signature_is_refused_and_nothing_is_stored(client, py_handler):
    _hmac_handler(py_handler)
    body = b'{"id": "evt-1"}'
    assert _post(client, body).status_code == 401
    assert _post(client, body, **{"X-Runner-Signature": signature("wrong", body)}).status_code == 401
    tampered = _post(client, b'{"id": "evt-2"}', **{"X-Runner-Signature": signature(SECRET, body)})
    assert tampered.status_code == 401
    assert not Execution.objects.exists()


def test_a_token_handler_refuses_a_wrong_token_and_accepts_the_right_one(client, py_handler):
    py_handler.webhook_auth = Handler.WebhookAuth.TOKEN
    py_handler.set_webhook_secret(SECRET)
    py_handler.save()
    assert _post(client, b"{}", Authorization="Bearer nope").status_code == 401
    assert _post(client, b"{}").status_code == 401
    assert not ExecutionItem.objects.exists()
    assert _post(client, b"{}", Authorization=f"Bearer {SECRET}").status_code == 202
    assert ExecutionItem.objects.count() == 1


def test_a_handler_without_a_secret_accepts_no_webhook(client, py_handler):
    assert _post(client, b"{}", Authorization="Bearer ").status_code == 401
    assert client.post("/hooks/crm-x/unknown", data=b"{}", content_type="application/json").status_code == 404
    assert not Execution.objects.exists()


def test_a_burst_of_1000_concurrent_webhooks_is_accepted_in_full_and_processed(
    live_server, py_handler, run_jobs
):
    _hmac_handler(py_handler)
    url = f"{live_server.url}/hooks/crm-x/leads"

    def send(i: int) -> int:
        body = json.dumps({"id": f"evt-{i}"}).encode()
        with httpx.Client(timeout=30) as c:
            r = c.post(
                url,
                content=body,
                headers={"Content-Type": "application/json", "X-Runner-Signature": signature(SECRET, body)},
            )
        return r.status_code

    with ThreadPoolExecutor(max_workers=32) as pool:
        statuses = list(pool.map(send, range(1000)))
    assert statuses.count(202) == 1000
    assert ExecutionItem.objects.count() == 1000
    run_jobs()
    assert ExecutionItem.objects.filter(status="succeeded").count() == 1000
    assert set(ExecutionItem.objects.values_list("external_id", flat=True)) == {
        f"evt-{i}" for i in range(1000)
    }
    assert not Execution.objects.exclude(status="completed").exists()
