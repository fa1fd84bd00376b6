"""The conversation surfaces probed as an attacker would (issue 27): the media download (a
customer's HTML document, media ids naming another Graph path, a media URL into our own network),
Chatwoot's webhook (private notes however flagged, another organization's URL, bodies), Meta's
inbound webhook (a context naming another organization's message, another organization's number),
the manager's reply form (CSRF, another organization's customer, a viewer, outside the window) and
the opt-out words (hypothesis over case, accents, invisible characters and decorations). Real
PostgreSQL, Redis, loopback HTTP servers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from campaigns import selectors
from crm.models import Customer, Membership, Organization, Store
from integrations import outbound
from integrations.chatwoot.webhooks import agent_reply
from integrations.errors import IntegrationError
from integrations.whatsapp.media import MEDIA_ID, media_fetch
from messaging import chatwoot_replies, conversations
from messaging.models import ConversationMessage
from tests.campaigns.conftest import whatsapp_number
from tests.campaigns.test_conversations import _inbound, _message, _sent_campaign

Status = ConversationMessage.Status


class _Fake:
    """A loopback HTTP server answering GETs from a table path -> (status, content type, body);
    it records every path asked for."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, str, bytes]] = {}
        self.hits: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.hits.append(self.path)
                status, kind, body = fake.routes.get(self.path, (404, "text/plain", b"no"))
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Fake:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def graph() -> Iterator[_Fake]:
    with _Fake() as server:
        yield server


@pytest.fixture
def victim() -> Iterator[_Fake]:
    with _Fake() as server:
        yield server


def _media_row(wa, graph: _Fake, *, mime: str, body: bytes, filename: str) -> ConversationMessage:
    number = wa["number"]
    number.graph_url = graph.url
    number.save()
    graph.routes["/v21.0/4242"] = (200, "application/json", json.dumps({"url": f"{graph.url}/file"}).encode())
    graph.routes["/file"] = (200, mime, body)
    ana = wa["customers"](1)[0]
    return ConversationMessage.objects.create(
        organization=wa["org"],
        customer=ana,
        whatsapp_number=number,
        direction=ConversationMessage.Direction.INBOUND,
        kind="document",
        media_id="4242",
        media_mime=mime,
        media_filename=filename,
    )


@pytest.mark.parametrize(
    ("mime", "inline"),
    [("text/html", False), ("image/svg+xml", False), ("application/pdf", False), ("image/png", True)],
)
def test_a_customers_document_is_downloaded_never_run_on_the_admins_origin(
    wa, graph, admin_client, settings, mime, inline
):
    settings.WHATSAPP_GRAPH_VERSION = "v21.0"
    script = b"<script>fetch('/admin/password_change/')</script>"
    row = _media_row(wa, graph, mime=mime, body=script, filename='nota".html\r\nSet-Cookie: x=1')
    response = admin_client.get(f"/admin/messaging/conversationmessage/{row.pk}/media/")
    assert response.status_code == 200 and response.content == script
    disposition = response["Content-Disposition"]
    assert disposition.startswith("inline" if inline else "attachment"), disposition
    assert "\r" not in disposition and "\n" not in disposition and 'nota\\"' in disposition
    assert response["Content-Security-Policy"] == "sandbox"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "Set-Cookie" not in response.headers


@hsettings(max_examples=200)
@given(
    media_id=st.one_of(
        st.sampled_from(["..", "1/../me", "me?fields=accounts", "1#x", "%2e%2e", "1\\..", "a@b", "1\n"]),
        st.text(max_size=140),
    )
)
def test_a_media_id_that_would_name_another_graph_path_is_refused_before_any_request(media_id):
    assume(not MEDIA_ID.fullmatch(media_id))
    with pytest.raises(IntegrationError) as refused:
        media_fetch(base_url="http://127.0.0.1:9", version="v21.0", media_id=media_id, access_token="t")
    assert not refused.value.retryable and "not a media id" in str(refused.value)


def test_a_media_url_into_our_own_network_is_refused_by_the_guard(wa, graph, victim, settings, admin_client):
    settings.WHATSAPP_GRAPH_VERSION = "v21.0"
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = False
    outbound.trust_origin(graph.url)  # the operator's Graph (a sandbox on loopback) is trusted ...
    row = _media_row(wa, graph, mime="image/png", body=b"x", filename="a.png")
    victim.routes["/secret"] = (200, "text/plain", b"internal")
    graph.routes["/v21.0/4242"] = (
        200,
        "application/json",
        json.dumps({"url": f"{victim.url}/secret"}).encode(),
    )
    with pytest.raises(IntegrationError) as refused:  # ... the address Meta's answer names is not
        media_fetch(base_url=graph.url, version="v21.0", media_id="4242", access_token="t")
    assert not refused.value.retryable
    response = admin_client.get(f"/admin/messaging/conversationmessage/{row.pk}/media/", follow=True)
    assert response.status_code == 200 and b"internal" not in response.content
    assert victim.hits == []


_NOT_PRIVATE = {
    "event": "message_created",
    "id": 7,
    "content": "Temos sim!",
    "message_type": "outgoing",
    "content_attributes": {},
    "conversation": {"id": 5, "meta": {"sender": {"phone_number": "+5511980000000"}}},
}


@given(flag=st.one_of(st.just(True), st.just(1), st.text(min_size=1), st.integers(min_value=1), st.just([1])))
def test_a_private_note_however_its_flag_is_spelled_is_never_sent_to_the_customer(flag):
    assert agent_reply({**_NOT_PRIVATE, "private": flag}) is None
    assert agent_reply({**_NOT_PRIVATE, "private": False}) is not None
    assert agent_reply(dict(_NOT_PRIVATE)) is not None


def test_chatwoot_webhook_bodies_and_urls_an_attacker_would_try(wa, client, drain_inbox, run_jobs, sandbox):
    ana = wa["customers"](1)[0]
    other = Organization.objects.create(name="Outra", slug="outra")
    own = f"/webhooks/chatwoot/{chatwoot_replies.webhook_token(wa['org'].pk)}/"
    theirs = f"/webhooks/chatwoot/{chatwoot_replies.webhook_token(other.pk)}/"
    body = {**_NOT_PRIVATE, "conversation": {"id": 5, "meta": {"sender": {"phone_number": ana.phone}}}}
    for url in ("/webhooks/chatwoot/1/", f"/webhooks/chatwoot/{wa['org'].pk}-{'0' * 40}/", own[:-2] + "/"):
        assert client.post(url, data=body, content_type="application/json").status_code == 403
    assert client.post(own, data=b"not json", content_type="application/json").status_code == 400
    assert (
        client.post(own, data=b'{"content": "\\u0000"}', content_type="application/json").status_code == 400
    )
    huge = {**body, "content": "x" * (2 * 1024 * 1024)}
    assert client.post(own, data=huge, content_type="application/json").status_code == 413
    # Another organization's URL with this organization's customer: nothing reaches her.
    assert client.post(theirs, data=body, content_type="application/json").json()["accepted"] == 1
    drain_inbox()
    run_jobs()
    assert not ConversationMessage.objects.filter(customer=ana, direction="out").exists()
    assert sandbox.messages() == []


def test_a_context_naming_another_organizations_message_ties_nothing_to_its_campaign(
    wa, meta, drain_inbox, run_jobs, sandbox
):
    campaign, people = _sent_campaign(wa, run_jobs, n=1)
    theirs = people[0]
    sent = campaign.whatsapp_messages.get()
    other = Organization.objects.create(name="Outra", slug="outra")
    whatsapp_number(
        other,
        sandbox,
        store=Store.objects.create(organization=other, erp_code="9", name="B"),
        phone_number_id="555000111",
        display="+5511950000000",
    )
    reply = _message("wamid.X1", theirs.phone.lstrip("+"), text={"body": "oi"}, context={"id": sent.wamid})
    meta(_inbound(reply, phone_number_id="555000111"))
    drain_inbox()
    row = ConversationMessage.objects.get(wamid="wamid.X1")
    assert row.organization_id == other.pk and row.campaign_id is None and row.campaign_message_id is None
    assert row.customer.organization_id == other.pk and row.customer_id != theirs.pk  # routed by number
    assert selectors.campaign_replies(campaign_id=campaign.pk) == 0


def _member(org: Organization, role: str, name: str) -> Client:
    user = User.objects.create_user(name, password=f"pw-{name}-1234")
    Membership.objects.create(user=user, organization=org, role=role)
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.get(pk=user.pk))
    return client


def test_the_reply_form_refuses_forged_requests_others_customers_viewers_and_a_closed_window(
    wa, meta, drain_inbox
):
    ana, bia = wa["customers"](2)
    meta(_inbound(_message("wamid.F1", ana.phone.lstrip("+"), text={"body": "oi"})))
    old = int((timezone.now() - timedelta(hours=25)).timestamp())
    meta(_inbound(_message("wamid.F2", bia.phone.lstrip("+"), ts=old, text={"body": "oi"})))
    drain_inbox()
    other = Organization.objects.create(name="Outra", slug="outra")
    manager, viewer, stranger = (
        _member(wa["org"], "manager", "manu"),
        _member(wa["org"], "viewer", "vera"),
        _member(other, "manager", "otto"),
    )
    url = f"/admin/messaging/conversationmessage/customer/{ana.pk}/"
    assert manager.post(url, {"text": "forjado"}).status_code == 403  # no CSRF token
    page = manager.get(url)
    token = page.cookies["csrftoken"].value
    assert stranger.get(url).status_code == 404
    stranger.get(
        f"/admin/messaging/conversationmessage/customer/{Customer.objects.create(organization=other).pk}/"
    )
    assert (
        stranger.post(
            url, {"text": "alheio", "csrfmiddlewaretoken": stranger.cookies["csrftoken"].value}
        ).status_code
        == 404
    )
    viewer.get(url)
    assert (
        viewer.post(
            url, {"text": "vendo", "csrfmiddlewaretoken": viewer.cookies["csrftoken"].value}
        ).status_code
        == 403
    )
    closed = f"/admin/messaging/conversationmessage/customer/{bia.pk}/"
    assert manager.post(closed, {"text": "tarde", "csrfmiddlewaretoken": token}).status_code == 302
    late = ConversationMessage.objects.get(direction="out")
    assert (late.customer_id, late.status) == (bia.pk, Status.REFUSED)
    assert manager.post(url, {"text": "ok", "csrfmiddlewaretoken": token}).status_code == 302
    assert set(ConversationMessage.objects.filter(direction="out").values_list("text", flat=True)) == {
        "tarde",
        "ok",
    }


_INVISIBLE = st.sampled_from(["\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u2060", "\ufeff", "\u00ad"])
_ACCENT = st.sampled_from([chr(c) for c in range(0x300, 0x370)] + ["\ufe0f"])
_EDGE = st.sampled_from(list(" \t\n\u00a0\u3000\u2002.,;:!?¡¿…'\"\u201c\u201d\u2018\u2019«»()[]-_*~🛑✋👍"))


@st.composite
def _decorated(draw, word: str) -> str:
    chars = []
    for c in word:
        c = c.upper() if draw(st.booleans()) else c.lower()
        if draw(st.booleans()):
            c = (
                chr(ord(c) - ord("A") + 0xFF21) if c.isupper() else chr(ord(c) - ord("a") + 0xFF41)
            )  # fullwidth
        chars.append(c + draw(st.text(_ACCENT, max_size=2)) + draw(st.text(_INVISIBLE, max_size=1)))
    return draw(st.text(_EDGE, max_size=3)) + "".join(chars) + draw(st.text(_EDGE, max_size=3))


_KEYWORDS = conversations.Keywords(
    opt_out=conversations.keyword_set("PARAR\nSAIR\nSTOP\nCANCELAR\nDESCADASTRAR"),
    resume=conversations.keyword_set("VOLTAR\nRETOMAR\nSTART"),
    buttons=conversations.keyword_set("Parar promoções"),
)


@hsettings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), word=st.sampled_from(["PARAR", "SAIR", "STOP", "CANCELAR", "DESCADASTRAR"]))
def test_an_opt_out_word_however_typed_opts_out_and_a_longer_text_does_not(data, word):
    typed = data.draw(_decorated(word))
    assert _KEYWORDS.intent(kind="text", text=typed) == "opt_out", ascii(typed)
    assert _KEYWORDS.intent(kind="text", text=f"{typed} amanhã") == ""
    assert _KEYWORDS.intent(kind="image", text=typed) == ""


@given(word=st.sampled_from(["VOLTAR", "RETOMAR", "START"]), data=st.data())
def test_a_resume_word_however_typed_resumes(word, data):
    assert _KEYWORDS.intent(kind="text", text=data.draw(_decorated(word))) == "resume"


@given(text=st.text(max_size=60))
def test_any_text_gives_an_intent_or_nothing_never_a_crash(text):
    assert _KEYWORDS.intent(kind="text", text=text, payload=text) in ("opt_out", "resume", "")


@given(kind=st.one_of(st.sampled_from(["incoming", 0, 2, 3, "activity", "template", None, "1"]), st.text()))
def test_only_an_outgoing_message_is_an_agents_reply(kind):
    assume(kind not in ("outgoing", 1))
    assert agent_reply({**_NOT_PRIVATE, "message_type": kind}) is None


def test_meta_webhook_bodies_an_attacker_would_try(wa, client, settings, drain_inbox):
    from tests.campaigns.conftest import META_SECRET, meta_signature

    ana = wa["customers"](1)[0]
    text = "PARAR? \u202eRAZ 👍 " + "ç" * 50_000
    twice = _inbound(
        _message("wamid.D1", ana.phone.lstrip("+"), text={"body": text}),
        _message("wamid.D1", ana.phone.lstrip("+"), text={"body": text}),
    )

    def post(body: bytes, signature: str | None) -> int:
        extra = {"HTTP_X_HUB_SIGNATURE_256": signature} if signature is not None else {}
        return client.post(
            "/webhooks/whatsapp/", data=body, content_type="application/json", **extra
        ).status_code

    settings.WHATSAPP_APP_SECRET = ""  # a deployment without the secret accepts nothing
    assert post(twice, meta_signature(twice)) == 403
    settings.WHATSAPP_APP_SECRET = META_SECRET
    assert post(twice, None) == 403
    assert post(twice, "sha256=" + "0" * 64) == 403
    assert post(twice, meta_signature(twice + b" ")) == 403  # another body's signature
    huge = _inbound(_message("wamid.H1", ana.phone.lstrip("+"), text={"body": "x" * (2 * 1024 * 1024)}))
    assert post(huge, meta_signature(huge)) == 413
    assert post(b"[1, 2", meta_signature(b"[1, 2")) == 400
    deep = b'{"entry": ' + b"[" * 200 + b"]" * 200 + b"}"
    assert post(deep, meta_signature(deep)) == 400
    for _ in range(2):  # the same wamid twice in a body and in a resent body: stored once
        assert post(twice, meta_signature(twice)) == 200
        drain_inbox()
    stored = ConversationMessage.objects.get(wamid="wamid.D1")  # get: exactly one
    assert (
        stored.text == text[:4096]
    )  # unicode (a right-to-left override, emoji) kept as sent, never an opt-out
    ana.refresh_from_db()
    assert ana.whatsapp_opted_out_at is None


def test_what_a_customer_writes_and_calls_herself_is_shown_escaped(wa, meta, drain_inbox, admin_client):
    script = "<script>alert(1)</script>"
    body = _inbound(
        _message("wamid.S1", "5511980000077", text={"body": f"<img src=x onerror=alert(2)>{script}"})
    )
    meta(body.replace(b"Dona Zilda", script.encode()))
    drain_inbox()
    customer = Customer.objects.get(phone="+5511980000077")
    assert customer.name == script
    for url in (
        f"/admin/messaging/conversationmessage/customer/{customer.pk}/",
        f"/admin/crm/customer/{customer.pk}/change/",
        "/admin/messaging/conversationmessage/",
    ):
        page = admin_client.get(url).content.decode()
        assert "<script>alert" not in page and "<img src=x" not in page, url
        assert "&lt;script&gt;alert" in page or "&lt;img src=x" in page, url  # shown, escaped
