"""The production WSGI application (crm/wsgi.py) through gunicorn: webhook intakes take the lean
middleware stack (no session, CSRF, language or login lockout), every other path the full one,
and the intakes still refuse hostile input with a JSON 4xx."""

from __future__ import annotations

import httpx
import pytest

from crm import intake
from runner.models import Handler, IntegrationType

TOKEN = "wsgi-test-token-0123456789"


@pytest.fixture
def hook(web_server):
    from crm.models import Organization

    org = Organization.objects.create(name="Loja WSGI", slug="loja-wsgi")
    it = IntegrationType.objects.create(integration_key="wsgi-x", name="WSGI X")
    handler = Handler(
        integration=it,
        handler_key="events",
        direction="inbound",
        kind=Handler.Kind.PYTHON,
        callable_path="tests.runner.handlers.noop",
        organization=org,
        webhook_auth=Handler.WebhookAuth.TOKEN,
    )
    handler.set_webhook_secret(TOKEN)
    handler.save()
    return f"{web_server}/hooks/wsgi-x/events"


def _lean(response: httpx.Response) -> None:
    """Answered by the intake stack: JSON, no cookie, no language negotiation."""
    assert response.headers["Content-Type"] == "application/json"
    assert "set-cookie" not in response.headers and "Content-Language" not in response.headers
    assert "Cookie" not in response.headers.get("Vary", "")
    assert response.headers["X-Content-Type-Options"] == "nosniff"  # SecurityMiddleware still runs
    assert response.json()["error"]


def test_intakes_take_the_lean_stack_and_pages_the_full_one(web_server, hook):
    unsigned = httpx.post(f"{web_server}/webhooks/whatsapp/", content=b"{}", timeout=30)
    assert unsigned.status_code == 403
    _lean(unsigned)
    unknown = httpx.post(f"{web_server}/hooks/no/such", content=b"{}", timeout=30)
    assert unknown.status_code == 404
    _lean(unknown)
    esp = httpx.post(f"{web_server}/anymail/postmark/tracking/", content=b"{}", timeout=30)
    assert esp.status_code == 401
    _lean(esp)

    page = httpx.get(f"{web_server}/admin/login/", timeout=30)
    assert page.status_code == 200
    assert "csrftoken" in page.headers.get("set-cookie", "") and page.headers["Content-Language"]


HOSTILE_BODIES = [
    (b'{"a": NaN}', 400),
    (b'{"a": 1e400}', 400),
    (b'{"a": "\\u0000"}', 400),
    (b'{"\\ud800": 1}', 400),
    (b"null", 400),
    (b"", 400),
    (b"[" * 100 + b"]" * 100, 400),
    (b'{"a": "' + b"x" * (intake.MAX_BYTES + 1) + b'"}', 413),
]


def test_hostile_bodies_get_a_json_4xx_from_the_lean_stack(hook):
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with httpx.Client(timeout=30) as client:
        for body, status in HOSTILE_BODIES:
            response = client.post(hook, content=body, headers=headers)
            assert response.status_code == status, (body[:40], response.text[:200])
            _lean(response)
