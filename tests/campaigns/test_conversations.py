"""Conversations: every inbound WhatsApp message stored once and honoured (opt-out words, the 24-hour
window), delivered to Chatwoot in order, and agents' replies sent back — real HTTP against the Meta
and Chatwoot sandboxes, real PostgreSQL, Redis and RQ workers."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from campaigns import lifecycle
from campaigns.models import CampaignMetric, WhatsappMessage
from crm import hooks, recovery
from crm.models import Customer, OptOutSource
from integrations.models import ChatwootAccount
from integrations.whatsapp import webhooks
from messaging import chatwoot_inbound, chatwoot_replies, conversations
from messaging.models import ConversationMessage
from project.sandboxes.chatwoot import ChatwootSandbox
from tests.campaigns.conftest import META_SECRET as SECRET
from tests.campaigns.conftest import PHONE_NUMBER_ID

ACCOUNT_ID = 7
INBOX_ID = 3
CW_TOKEN = "cw-sandbox-api-access-token-0123456789"
Status = ConversationMessage.Status


def _message(wamid: str, sender: str, kind: str = "text", ts: int | None = None, **content: Any) -> dict:
    ts = ts if ts is not None else int(timezone.now().timestamp())
    message: dict[str, Any] = {"from": sender, "id": wamid, "timestamp": str(ts), "type": kind}
    message.update(content)
    return message


def _inbound(*messages: dict, phone_number_id: str = PHONE_NUMBER_ID) -> bytes:
    value = {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "5511940000000", "phone_number_id": phone_number_id},
        "contacts": [{"profile": {"name": "Dona Zilda"}, "wa_id": m["from"]} for m in messages],
        "messages": list(messages),
    }
    payload = {
        "object": "whatsapp_business_account",
        "entry": [{"id": "1", "changes": [{"field": "messages", "value": value}]}],
    }
    return json.dumps(payload).encode()


@pytest.fixture
def cw():
    with ChatwootSandbox(accounts={ACCOUNT_ID: CW_TOKEN}, inboxes={INBOX_ID: ACCOUNT_ID}) as server:
        yield server


def _chatwoot(org, cw: ChatwootSandbox, token: str = CW_TOKEN) -> ChatwootAccount:
    account = ChatwootAccount(organization=org, base_url=cw.url, account_id=ACCOUNT_ID, inbox_id=INBOX_ID)
    account.set_api_token(token)
    account.save()
    return account


def _sent_campaign(wa, run_jobs, n: int = 2):
    people = wa["customers"](n)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    return campaign, people


def test_every_type_is_stored_once_routed_and_tied_to_customer_and_campaign(wa, meta, drain_inbox, run_jobs):
    seen: list[hooks.CustomerEvent] = []
    hooks.on_customer_events("test", lambda events: seen.extend(events) or len(events))
    try:
        campaign, people = _sent_campaign(wa, run_jobs)
        answered = WhatsappMessage.objects.get(customer=people[0])
        ana = people[0].phone.lstrip("+")
        body = _inbound(
            _message("wamid.A1", ana, text={"body": "Quero!"}, context={"id": answered.wamid}),
            _message(
                "wamid.A2",
                ana,
                "image",
                image={"id": "media-1", "mime_type": "image/jpeg", "caption": "olha"},
            ),
            _message(
                "wamid.A3",
                people[1].phone.lstrip("+"),
                "reaction",
                reaction={"message_id": "x", "emoji": "👍"},
            ),
            _message(
                "wamid.A4",
                "5511912345678",
                "location",
                location={"latitude": -23.5, "longitude": -46.6, "name": "Casa"},
            ),
            _message("wamid.A5", ana, "brand_new_type"),
        )
        assert meta(body) == {"ok": True, "accepted": 5, "skipped": 0}
        meta(body)  # Meta retries: stored once
        drain_inbox()
    finally:
        hooks.off_customer_events("test")
    rows = {r.wamid: r for r in ConversationMessage.objects.all()}
    assert sorted(rows) == ["wamid.A1", "wamid.A2", "wamid.A3", "wamid.A4", "wamid.A5"]
    assert rows["wamid.A1"].campaign_id == campaign.pk and rows["wamid.A1"].campaign_message_id == answered.pk
    assert rows["wamid.A2"].campaign_id == campaign.pk  # no context: the latest message from that number
    assert (rows["wamid.A2"].media_id, rows["wamid.A2"].media_mime, rows["wamid.A2"].text) == (
        "media-1",
        "image/jpeg",
        "olha",
    )
    assert rows["wamid.A5"].kind == "unsupported"
    assert {r.whatsapp_number_id for r in rows.values()} == {wa["number"].pk}
    assert {r.store_id for r in rows.values()} == {wa["store"].pk}
    stranger = Customer.objects.get(phone="+5511912345678")
    assert (stranger.name, stranger.marketing_consent, stranger.organization_id) == (
        "Dona Zilda",
        False,
        wa["org"].pk,
    )
    assert rows["wamid.A4"].campaign_id is None and rows["wamid.A4"].customer_id == stranger.pk
    replies = [e for e in seen if e.kind == "whatsapp_reply"]
    assert sorted(e.key for e in replies) == sorted(rows)
    assert [e.customer_id for e in seen if e.kind == "customer_created"] == [stranger.pk]


def test_an_inbound_for_a_number_nobody_has_is_dropped_without_error(wa, meta, drain_inbox):
    meta(_inbound(_message("wamid.X", "5511987650000", text={"body": "oi"}), phone_number_id="999"))
    drain_inbox()
    assert (
        not ConversationMessage.objects.exists()
        and not Customer.objects.filter(phone="+5511987650000").exists()
    )


@pytest.mark.parametrize("word", ["PARAR", "  parar. ", "Sair", "stop", "Descadastrar!", "cancelar"])
def test_an_opt_out_word_opts_out_at_once_with_source_keyword_and_confirms(
    wa, meta, drain_inbox, run_jobs, sandbox, word
):
    ana = wa["customers"](1)[0]
    meta(_inbound(_message("wamid.P1", ana.phone.lstrip("+"), text={"body": word})))
    drain_inbox()
    ana.refresh_from_db()
    assert ana.whatsapp_opted_out_at is not None and ana.whatsapp_opt_out_source == OptOutSource.KEYWORD
    run_jobs()
    confirmation = ConversationMessage.objects.get(direction="out")
    assert (confirmation.status, confirmation.source) == (Status.SENT, "confirmation")
    sent = sandbox.messages()
    assert len(sent) == 1 and sent[0]["template"]["body"].startswith("Pronto")


def test_the_templates_opt_out_button_and_an_edited_keyword_opt_out_and_voltar_opts_back_in(
    wa, meta, drain_inbox, run_jobs
):
    ana, bruno = wa["customers"](2)
    settings_ = conversations.settings_for(wa["org"].pk)
    settings_.opt_out_keywords = "chega"
    settings_.save()
    meta(
        _inbound(
            _message(
                "wamid.B1",
                ana.phone.lstrip("+"),
                "button",
                button={"text": "Parar promoções", "payload": "STOP_PROMO"},
            ),
            _message("wamid.B2", bruno.phone.lstrip("+"), text={"body": "Chegá"}),
        )
    )
    drain_inbox()
    assert Customer.objects.filter(whatsapp_opt_out_source=OptOutSource.KEYWORD).count() == 2
    meta(_inbound(_message("wamid.B3", ana.phone.lstrip("+"), text={"body": "voltar"})))
    meta(
        _inbound(_message("wamid.B4", bruno.phone.lstrip("+"), text={"body": "parar"}))
    )  # no longer a keyword
    drain_inbox()
    ana.refresh_from_db()
    bruno.refresh_from_db()
    assert ana.whatsapp_opted_out_at is None and bruno.whatsapp_opted_out_at is not None


def test_a_reply_outside_the_24_hour_window_is_refused_and_nothing_is_sent(
    wa, meta, drain_inbox, run_jobs, sandbox, english
):
    ana = wa["customers"](1)[0]
    old = int((timezone.now() - timedelta(hours=25)).timestamp())
    meta(_inbound(_message("wamid.W1", ana.phone.lstrip("+"), text={"body": "oi"}, ts=old)))
    drain_inbox()
    refused = conversations.reply_queue(customer=ana, text="Olá!", source="manager")
    assert refused.status == Status.REFUSED and "24-hour" in refused.error
    meta(_inbound(_message("wamid.W2", ana.phone.lstrip("+"), text={"body": "oi de novo"})))
    drain_inbox()
    reply = conversations.reply_queue(customer=ana, text="Olá!", source="manager")
    assert reply.status == Status.QUEUED
    run_jobs()
    reply.refresh_from_db()
    assert reply.status == Status.SENT and reply.wamid
    assert [m["template"] for m in sandbox.messages()] == [{"type": "text", "body": "Olá!"}]


def test_inbound_reaches_chatwoot_as_incoming_in_order_and_waits_while_it_is_down(
    wa, meta, drain_inbox, run_jobs, cw
):
    _chatwoot(wa["org"], cw)
    ana = wa["customers"](1)[0]
    cw.fail_next(1, status=503)
    for i in range(3):
        meta(_inbound(_message(f"wamid.C{i}", ana.phone.lstrip("+"), text={"body": f"mensagem {i}"})))
    drain_inbox()
    run_jobs(["chatwoot-inbound"], settle=0)
    assert chatwoot_inbound.waiting() == {wa["org"].pk: 3}  # Chatwoot down: they wait
    assert "503" in ConversationMessage.objects.order_by("id").first().chatwoot_error
    assert chatwoot_inbound.push(organization_id=wa["org"].pk) == 3
    assert [m["content"] for m in cw.messages()] == ["mensagem 0", "mensagem 1", "mensagem 2"]
    assert {m["message_type"] for m in cw.messages()} == {0}  # incoming
    assert chatwoot_inbound.waiting() == {}


def test_a_message_whose_answer_was_lost_is_found_and_not_posted_twice(wa, meta, drain_inbox, run_jobs, cw):
    _chatwoot(wa["org"], cw)
    ana = wa["customers"](1)[0]
    for i in range(2):
        meta(_inbound(_message(f"wamid.L{i}", ana.phone.lstrip("+"), text={"body": f"mensagem {i}"})))
    drain_inbox()
    cw.lose_next_answers(1)  # Chatwoot takes the first message, its answer never comes back
    run_jobs(["chatwoot-inbound"], settle=0)
    first = ConversationMessage.objects.order_by("id").first()
    assert first.chatwoot_pending and first.chatwoot_error.startswith(chatwoot_inbound.MAYBE_DELIVERED)
    assert chatwoot_inbound.push(organization_id=wa["org"].pk) == 2
    assert [m["content"] for m in cw.messages()] == ["mensagem 0", "mensagem 1"]  # each once, in order
    assert len(cw.conversations()) == 1 and len(cw.contacts()) == 1
    first.refresh_from_db()
    assert first.chatwoot_message_id == cw.messages()[0]["id"]


def test_a_refused_token_keeps_messages_waiting_until_fixed_then_recover_delivers_them(
    wa, meta, drain_inbox, run_jobs, cw
):
    account = _chatwoot(wa["org"], cw, token="wrong-token")
    ana = wa["customers"](1)[0]
    meta(_inbound(_message("wamid.T1", ana.phone.lstrip("+"), text={"body": "alguém aí?"})))
    drain_inbox()
    run_jobs(["chatwoot-inbound"], settle=0)
    assert chatwoot_inbound.waiting() == {wa["org"].pk: 1} and not cw.messages()
    account.set_api_token(CW_TOKEN)
    account.save()
    ConversationMessage.objects.update(created_at=timezone.now() - timedelta(minutes=1))
    assert recovery.recover()["chatwoot-inbound"] == 1
    run_jobs(["chatwoot-inbound"], settle=0)
    assert [m["content"] for m in cw.messages()] == ["alguém aí?"] and chatwoot_inbound.waiting() == {}


def test_an_agents_reply_goes_out_from_the_same_number_once(
    wa, meta, drain_inbox, run_jobs, cw, client, sandbox
):
    _chatwoot(wa["org"], cw)
    ana = wa["customers"](1)[0]
    meta(_inbound(_message("wamid.R1", ana.phone.lstrip("+"), text={"body": "tem tamanho 40?"})))
    drain_inbox()
    run_jobs()
    url = f"/webhooks/chatwoot/{chatwoot_replies.webhook_token(wa['org'].pk)}/"
    body = {
        "event": "message_created",
        "id": 991,
        "content": "Temos sim!",
        "message_type": "outgoing",
        "private": False,
        "content_attributes": {},
        "conversation": {"id": 5, "meta": {"sender": {"phone_number": ana.phone}}},
    }
    assert client.post(url.replace("-", "-0"), data=body, content_type="application/json").status_code == 403
    for _ in range(2):  # a repeated webhook sends nothing twice
        response = client.post(url, data=body, content_type="application/json")
        assert response.json() == {"ok": True, "accepted": 1}
        drain_inbox()
    ours = {**body, "id": 992, "content_attributes": {"crm_message_id": 1}}
    assert client.post(url, data=ours, content_type="application/json").json()["accepted"] == 0
    run_jobs()
    reply = ConversationMessage.objects.get(direction="out")
    assert (reply.status, reply.source, reply.chatwoot_message_id) == (Status.SENT, "chatwoot", 991)
    assert reply.whatsapp_number_id == wa["number"].pk
    assert [m["template"]["body"] for m in sandbox.messages()] == ["Temos sim!"]


_TYPES = st.sampled_from(
    [
        "text",
        "button",
        "interactive",
        "image",
        "audio",
        "document",
        "sticker",
        "location",
        "contacts",
        "reaction",
        "x",
    ]
)
_ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


@hsettings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(kind=_TYPES, body=_ANY, context=_ANY)
def test_parsing_any_inbound_message_gives_values_or_a_value_error_never_a_crash(kind, body, context):
    message = {
        "from": "5511999990001",
        "id": "wamid.H",
        "timestamp": "1731700000",
        "type": kind,
        kind: body,
        "context": context,
    }
    payload = {
        "object": "whatsapp_business_account",
        "entry": [{"changes": [{"value": {"messages": [message]}}]}],
    }
    parsed = webhooks.parse(payload).messages
    assert len(parsed) == 1 and parsed[0].timestamp == datetime.fromtimestamp(1731700000, tz=UTC)
    assert isinstance(parsed[0].text, str) and parsed[0].kind in webhooks.MESSAGE_TYPES


@given(word=st.sampled_from(["PARAR", "Parar", " pârar ", "PARAR!", "parar."]))
def test_keywords_ignore_case_accents_spaces_and_punctuation(word):
    keywords = conversations.Keywords(
        opt_out=conversations.keyword_set("PARAR"), resume=frozenset(), buttons=frozenset()
    )
    assert keywords.intent(kind="text", text=word) == "opt_out"
    assert keywords.intent(kind="text", text="parar de mandar isso por favor") == ""
    assert keywords.intent(kind="image", text=word) == ""


def test_the_campaign_counts_its_replies_and_the_pages_show_them(
    wa, meta, drain_inbox, run_jobs, admin_client
):
    from campaigns import selectors

    campaign, people = _sent_campaign(wa, run_jobs, 3)
    for i, person in enumerate(people[:2]):
        meta(_inbound(_message(f"wamid.S{i}", person.phone.lstrip("+"), text={"body": f"quero {i}"})))
    meta(_inbound(_message("wamid.S9", people[0].phone.lstrip("+"), text={"body": "de novo"})))
    drain_inbox()
    assert selectors.campaign_status(campaign=campaign)["replies"] == 2  # recipients, not messages
    page = admin_client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert 'data-field="replies">2<' in page and 'data-field="reply_rate">66,6%<' in page
    assert "de novo" in page
    board = admin_client.get(f"/admin/crm/organization/{wa['org'].pk}/dashboard/").content.decode()
    stores = board[board.index('id="dashboard-replies-stores"') :]
    assert "Centro" in stores and '<td data-field="replies">3</td>' in stores
    customer_page = admin_client.get(f"/admin/crm/customer/{people[0].pk}/change/").content.decode()
    assert "quero 0" in customer_page and 'id="customer-conversation"' in customer_page


def test_a_manager_answers_from_the_customers_conversation_and_opens_its_media(
    wa, meta, drain_inbox, run_jobs, admin_client, sandbox, english
):
    ana = wa["customers"](1)[0]
    meta(
        _inbound(
            _message(
                "wamid.M1",
                ana.phone.lstrip("+"),
                "image",
                image={"id": "media-abc", "mime_type": "image/png"},
            )
        )
    )
    drain_inbox()
    url = f"/admin/messaging/conversationmessage/customer/{ana.pk}/"
    page = admin_client.get(url).content.decode()
    assert "open media" in page and "window is open" in page
    response = admin_client.post(url, {"text": "Recebemos a foto!"})
    assert response.status_code == 302
    run_jobs()
    assert [m["template"]["body"] for m in sandbox.messages()] == ["Recebemos a foto!"]
    row = ConversationMessage.objects.get(wamid="wamid.M1")
    media = admin_client.get(f"/admin/messaging/conversationmessage/{row.pk}/media/")
    assert (
        media.status_code == 200
        and media["Content-Type"] == "image/png"
        and media.content.startswith(b"\x89PNG")
    )
    waiting = admin_client.get("/admin/messaging/conversationmessage/?chatwoot=waiting")
    assert waiting.status_code == 200 and "0 waiting for Chatwoot" in waiting.content.decode()


def _status_body(message: WhatsappMessage, status: str, *, billable: bool | None) -> bytes:
    entry: dict = {"id": message.wamid, "status": status, "timestamp": "1764756000", "recipient_id": "x"}
    if billable is not None:
        entry["pricing"] = {"billable": billable, "category": "marketing", "pricing_model": "PMP"}
    if status == "failed":
        entry["errors"] = [{"code": 131049, "title": "not delivered"}]
    value = {"metadata": {"phone_number_id": "1"}, "statuses": [entry]}
    payload = {
        "object": "whatsapp_business_account",
        "entry": [{"changes": [{"field": "messages", "value": value}]}],
    }
    return json.dumps(payload).encode()


def test_a_whatsapp_message_meta_does_not_bill_or_that_failed_costs_nothing(
    wa, run_jobs, drain_inbox, client, settings
):
    settings.WHATSAPP_APP_SECRET = SECRET
    wa["customers"](3)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    free, failed, paid = WhatsappMessage.objects.filter(campaign=campaign).order_by("id")
    assert CampaignMetric.objects.get(campaign=campaign).cost == Decimal("0.1875")  # 3 x 0.0625 (BR)
    for message, status, billable in (
        (free, "delivered", False),
        (failed, "failed", None),
        (paid, "delivered", True),
    ):
        body = _status_body(message, status, billable=billable)
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        for _ in range(2):  # Meta repeats itself: taken back once
            response = client.post(
                "/webhooks/whatsapp/",
                data=body,
                content_type="application/json",
                HTTP_X_HUB_SIGNATURE_256=signature,
            )
            assert response.status_code == 200
            drain_inbox()
    costs = dict(WhatsappMessage.objects.filter(campaign=campaign).values_list("id", "cost"))
    assert (costs[free.pk], costs[failed.pk], costs[paid.pk]) == (0, 0, Decimal("0.0625"))
    assert CampaignMetric.objects.get(campaign=campaign).cost == Decimal("0.0625")
