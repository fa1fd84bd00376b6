"""Every intake answers hostile but authenticated input with a 4xx and a JSON error, never a 5xx:
Meta's webhook (signed with the app secret) and the runner's webhook (signed with the handler's
secret), fed the hostile classics and whatever hypothesis makes."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crm import intake
from runner.models import ExecutionItem, Handler
from runner.views import signature
from tests.crm.test_intake import HOSTILE, json_values

APP_SECRET = "meta-app-secret-for-tests"
RUNNER_SECRET = "whsec-test-0123456789"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _meta(client, body: bytes):
    sig = "sha256=" + hmac.new(APP_SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {"X-Hub-Signature-256": sig}
    return client.post("/webhooks/whatsapp/", data=body, content_type="application/json", headers=headers)


def _runner(client, body: bytes):
    return client.post(
        "/hooks/crm-x/leads",
        data=body,
        content_type="application/json",
        headers={"X-Runner-Signature": signature(RUNNER_SECRET, body)},
    )


@pytest.fixture
def intakes(settings, py_handler):
    settings.WHATSAPP_APP_SECRET = APP_SECRET
    py_handler.webhook_auth = Handler.WebhookAuth.HMAC
    py_handler.set_webhook_secret(RUNNER_SECRET)
    py_handler.save()
    return {"meta": _meta, "runner": _runner}


def _refused(response) -> None:
    assert 400 <= response.status_code < 500, response.content[:300]
    assert response.json()["ok"] is False and response.json()["error"]


@pytest.mark.parametrize(("body", "said"), HOSTILE)
@pytest.mark.parametrize("which", ["meta", "runner"])
def test_the_hostile_classics_get_a_400_with_a_json_error(client, intakes, which, body, said):
    if body == b"null":
        said = "object or array" if which == "runner" else "must be a JSON object"
    response = intakes[which](client, body)
    _refused(response)
    assert response.status_code == 400
    assert said in response.json()["error"]
    assert not ExecutionItem.objects.exists()


@pytest.mark.parametrize("which", ["meta", "runner"])
def test_a_body_over_the_limit_gets_a_413(client, intakes, which):
    response = intakes[which](client, b'{"a": "' + b"x" * intake.MAX_BYTES + b'"}')
    _refused(response)
    assert response.status_code == 413


@FUZZ
@given(value=json_values)
def test_meta_answers_any_signed_json_with_a_4xx_or_applies_it(client, intakes, value):
    response = _meta(client, json.dumps(value).encode())
    assert response.status_code < 500
    if response.status_code != 200:
        _refused(response)


meta_shaped = st.fixed_dictionaries(
    {
        "object": st.just("whatsapp_business_account"),
        "entry": st.lists(
            st.fixed_dictionaries(
                {"changes": st.lists(st.fixed_dictionaries({"value": json_values}), max_size=3)}
            ),
            max_size=3,
        ),
    }
)


@FUZZ
@given(value=meta_shaped)
def test_meta_answers_payloads_of_its_outer_shape_with_a_4xx_or_applies_them(client, intakes, value):
    response = _meta(client, json.dumps(value).encode())
    assert response.status_code < 500


@FUZZ
@given(value=json_values)
def test_the_runner_answers_any_signed_json_with_a_4xx_or_stores_it(client, intakes, value):
    response = _runner(client, json.dumps(value).encode())
    assert response.status_code < 500
    if response.status_code >= 400:
        _refused(response)
