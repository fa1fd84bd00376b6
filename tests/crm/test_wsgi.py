"""The production WSGI application (crm/wsgi.py) through gunicorn: webhook intakes take the lean
middleware stack (no session, CSRF, language or login lockout), every other path the full one,
the intakes still refuse hostile input with a JSON 4xx, and any method on any URL under an
intake prefix gets a JSON answer, never a 5xx or an HTML page."""

from __future__ import annotations

from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def test_unknown_intake_urls_and_wrong_methods_get_a_json_404_and_405(web_server, hook):
    with httpx.Client(timeout=30) as client:
        for path in (
            "/webhooks/",
            "/webhooks/nope/",
            "/hooks/",
            "/hooks/a/b/c",
            "/anymail/x/",
            "/webhooks/whatsapp",
        ):
            response = client.post(f"{web_server}{path}", content=b"{}")
            assert response.status_code == 404, (path, response.text[:200])
            _lean(response)
            assert response.json() == {"ok": False, "error": "no intake at this URL"}
        for method, url in [
            ("GET", hook),
            ("PUT", f"{web_server}/webhooks/whatsapp/"),
            ("GET", f"{web_server}/anymail/postmark/tracking/"),
        ]:
            response = client.request(method, url)
            assert response.status_code == 405, (method, url, response.text[:200])
            _lean(response)
            assert response.json()["error"].startswith(f"method {method} not allowed here; use ")
            assert response.headers["Allow"] in response.json()["error"]


_SEGMENT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12).filter(
    lambda s: s not in (".", "..")  # a client resolves dot segments: the path would leave the prefix
)
_PATHS = st.builds(
    lambda prefix, segments, slash, query: (
        prefix + "/".join(quote(s, safe="") for s in segments) + ("/" if slash and segments else "") + query
    ),
    st.sampled_from(
        [*intake.INTAKE_PATHS, "/webhooks/whatsapp/", "/hooks/wsgi-x/", "/anymail/postmark/tracking/"]
    ),
    st.lists(_SEGMENT, max_size=4),
    st.booleans(),
    st.one_of(st.just(""), _SEGMENT.map(lambda s: "?" + quote(s, safe="=&"))),
)
_METHODS = st.one_of(
    st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE"]),
    # any method gunicorn parses (it answers a malformed request line itself, before Django)
    st.from_regex(r"\A[A-Z]{3,20}\Z"),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=_PATHS, method=_METHODS, body=st.one_of(st.just(b""), st.just(b"{}"), st.binary(max_size=64)))
def test_any_method_on_any_intake_url_gets_json_and_never_a_5xx(web_server, hook, path, method, body):
    with httpx.Client(timeout=30) as client:
        response = client.request(method, web_server + path, content=body)
    assert response.status_code < 500, (method, path, response.status_code, response.text[:200])
    if method == "HEAD":  # no body: the headers say what it would have been
        assert response.status_code < 400 or response.headers["Content-Type"] == "application/json"
        return
    assert response.headers["Content-Type"] == "application/json", (method, path, response.text[:200])
    if response.status_code >= 400:
        assert isinstance(response.json()["error"], str) and response.json()["error"]
