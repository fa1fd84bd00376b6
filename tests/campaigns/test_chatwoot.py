"""Mirroring sent campaign messages to Chatwoot: real HTTP against the Chatwoot sandbox, real
PostgreSQL, Redis and RQ workers; the mirror must never touch a send."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from campaigns import chatwoot, lifecycle, tasks
from campaigns.models import Campaign, CampaignMetric, WhatsappMessage
from crm import recovery
from integrations.chatwoot.client import ChatwootClient, parse_contact_create
from integrations.errors import IntegrationError
from integrations.models import ChatwootAccount
from messaging import chatwoot_inbound
from messaging.models import ChatwootThread, ConversationMessage
from project.sandboxes.chatwoot import ChatwootSandbox
from tests.conftest import child_env, redis_keys_holding, wait_for

S = WhatsappMessage.Status
ACCOUNT_ID = 7
INBOX_ID = 3
CW_TOKEN = "cw-sandbox-api-access-token-0123456789"
PHONE = "+5511987650001"


@pytest.fixture
def cw() -> Iterator[ChatwootSandbox]:
    with ChatwootSandbox(accounts={ACCOUNT_ID: CW_TOKEN}, inboxes={INBOX_ID: ACCOUNT_ID}) as server:
        yield server


@pytest.fixture
def client(cw) -> Iterator[ChatwootClient]:
    with ChatwootClient(base_url=cw.url, account_id=ACCOUNT_ID, api_token=CW_TOKEN) as c:
        yield c


def _account(org, cw: ChatwootSandbox, *, mode: str = "api_inbox", token: str = CW_TOKEN, **fields):
    account = ChatwootAccount(
        organization=org, base_url=cw.url, account_id=ACCOUNT_ID, inbox_id=INBOX_ID, mode=mode, **fields
    )
    account.set_api_token(token)
    account.save()
    return account


def _send(wa, run_jobs, n: int, *, queues: list[str] | None = None, **campaign_fields) -> Campaign:
    wa["customers"](n)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"](**campaign_fields))
    run_jobs(queues)
    return Campaign.objects.get(pk=campaign.pk)


def _send_state(campaign: Campaign) -> tuple:
    """Everything a mirror must never change: each message's send fields, the metric, the campaign."""
    messages = list(
        WhatsappMessage.objects.filter(campaign=campaign)
        .order_by("id")
        .values_list("id", "status", "attempts", "wamid", "sent_at", "error_code", "error_reason")
    )
    metric = CampaignMetric.objects.filter(campaign=campaign).values().get()
    return messages, metric, Campaign.objects.get(pk=campaign.pk).status


def _copies(campaign: Campaign):
    return ConversationMessage.objects.filter(campaign_id=campaign.pk, source="campaign")


def _waiting(org) -> int:
    return chatwoot_inbound.waiting(org.pk, campaign=True).get(org.pk, 0)


def _mirrored(cw: ChatwootSandbox) -> list[int]:
    return sorted(m["content_attributes"]["campaign_message_id"] for m in cw.messages())


def _sent_ids(campaign: Campaign) -> list[int]:
    return sorted(
        WhatsappMessage.objects.filter(campaign=campaign, status=S.SENT).values_list("id", flat=True)
    )


def _long_ago() -> None:
    """What waits, as the recovery pass sees it a minute later."""
    ConversationMessage.objects.update(created_at=timezone.now() - timedelta(minutes=1))


# -- end to end -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "private"), [("api_inbox", False), ("private_note", True)])
def test_every_sent_message_is_mirrored_once_to_its_contacts_conversation(
    wa, cw, run_jobs, redis_db, mode, private
):
    _account(wa["org"], cw, mode=mode)
    nameless = wa["customers"](1, start=50, name="")[0]  # skipped by the send: never mirrored
    campaign = _send(wa, run_jobs, 4)
    sent = list(WhatsappMessage.objects.filter(campaign=campaign, status=S.SENT).order_by("id"))
    assert len(sent) == 4

    mirrored = cw.messages()
    assert len(mirrored) == 4
    assert _mirrored(cw) == [m.pk for m in sent]
    assert {m["private"] for m in mirrored} == {private}
    assert {m["message_type"] for m in mirrored} == {1}  # outgoing
    contacts = cw.contacts()
    assert sorted(c["phone_number"] for c in contacts) == sorted(m.phone for m in sent)  # one per phone
    conversations = cw.conversations()
    assert len(conversations) == 4 and {c["inbox_id"] for c in conversations} == {INBOX_ID}
    assert len({c["meta"]["sender"]["id"] for c in conversations}) == 4  # one per contact
    by_phone = {m["phone"]: m for m in mirrored}
    first = sent[0]
    assert by_phone[first.phone]["content"] == "[campanha Black Friday] promo_bf: Cliente0"
    assert WhatsappMessage.objects.filter(campaign=campaign, chatwoot_mirrored_at__isnull=False).count() == 4
    skipped = WhatsappMessage.objects.get(customer=nameless)
    assert skipped.status == S.SKIPPED and skipped.chatwoot_mirrored_at is None
    # Each sent message is a line of its customer's conversation, delivered, and kept out of Redis.
    copies = _copies(campaign)
    assert sorted(copies.values_list("campaign_message_id", flat=True)) == [m.pk for m in sent]
    assert not copies.filter(chatwoot_pending=True).exists() and _waiting(wa["org"]) == 0
    assert {(c.direction, c.customer_id) for c in copies} == {("out", m.customer_id) for m in sent}
    assert redis_db.zcard("rq:failed:chatwoot-inbound") == 0
    # A new contact costs 2 calls (the contact, its conversation created with the message); its ids
    # are kept for the next.
    assert len(cw.requests()) == 4 * 2
    assert ChatwootThread.objects.filter(organization=wa["org"]).count() == 4


def test_running_the_mirror_again_mirrors_nothing_twice(wa, cw, run_jobs):
    _account(wa["org"], cw)
    campaign = _send(wa, run_jobs, 3)
    ids = list(WhatsappMessage.objects.filter(campaign=campaign).values_list("id", flat=True))
    assert len(cw.messages()) == 3
    asked = len(cw.requests())

    assert tasks.chatwoot_mirror(ids) == 0  # a mirror job from before the conversations' push
    chatwoot.chatwoot_enqueue_mirror(campaign_id=campaign.pk, message_ids=ids)
    run_jobs()
    assert len(cw.messages()) == 3 and _copies(campaign).count() == 3
    assert len(cw.requests()) == asked  # already mirrored: Chatwoot is not even asked


def test_a_campaign_message_and_the_customers_replies_share_one_conversation_in_order(wa, cw, run_jobs):
    _account(wa["org"], cw)
    campaign = _send(wa, run_jobs, 2, queues=["campaign-trigger", "whatsapp-send"])  # not pushed yet
    customer = WhatsappMessage.objects.filter(campaign=campaign).order_by("id").first().customer

    def reply(text: str) -> None:
        ConversationMessage.objects.create(
            organization=wa["org"], customer=customer, direction="in", text=text, chatwoot_pending=True
        )

    reply("quero")
    assert chatwoot_inbound.push(organization_id=wa["org"].pk) == 3
    reply("obrigado")
    assert chatwoot_inbound.push(organization_id=wa["org"].pk) == 1
    lines = [m for m in cw.messages() if m["phone"] == customer.phone]
    assert [(m["message_type"], m["content"]) for m in lines] == [
        (1, "[campanha Black Friday] promo_bf: Cliente0"),
        (0, "quero"),
        (0, "obrigado"),
    ]
    assert len({m["conversation_id"] for m in lines}) == 1
    # New contacts cost 2 calls each; the kept conversation, one call per later message.
    assert len(cw.requests()) == 2 * 2 + 1 + 1


def test_chatwoot_down_changes_no_send_and_the_mirror_waits_then_catches_up_in_order(
    wa, cw, sandbox, run_jobs, redis_db
):
    _account(wa["org"], cw)
    cw.fail_next(10_000, 500)
    campaign = _send(wa, run_jobs, 5)

    assert campaign.status == Campaign.Status.SENT
    messages, metric, _ = _send_state(campaign)
    assert {m[1] for m in messages} == {S.SENT} and {m[2] for m in messages} == {1}
    assert (metric["queued"], metric["sent"], metric["failed"], metric["skipped"]) == (5, 5, 0, 0)
    assert len(sandbox.messages()) == 5  # Meta got each message once
    assert cw.messages() == []
    # Waiting in PostgreSQL, the error kept; the push deferred itself (no attempt spent, nothing failed).
    assert _waiting(wa["org"]) == 5
    assert {
        "500" in e
        for e in _copies(campaign).exclude(chatwoot_error="").values_list("chatwoot_error", flat=True)
    } == {True}
    assert redis_db.zcard("rq:failed:chatwoot-inbound") == 0

    # Chatwoot back: everything is delivered, each once, and the sends are left alone.
    before = _send_state(campaign)
    cw.reset()
    assert chatwoot_inbound.push(organization_id=wa["org"].pk) == 5
    assert _mirrored(cw) == _sent_ids(campaign)
    assert _waiting(wa["org"]) == 0
    assert _send_state(campaign) == before


def test_a_refused_token_keeps_the_mirror_waiting_and_saving_the_fixed_token_sends_it(
    wa, cw, run_jobs, redis_db, caplog
):
    account = _account(wa["org"], cw, token="not-the-right-token")
    campaign = _send(wa, run_jobs, 4)

    assert campaign.status == Campaign.Status.SENT
    messages, metric, _ = _send_state(campaign)
    assert {m[1] for m in messages} == {S.SENT} and metric["sent"] == 4
    assert cw.messages() == [] and cw.contacts() == []
    assert {r["status"] for r in cw.requests()} == {401}
    assert redis_db.zcard("rq:failed:chatwoot-inbound") == 0
    assert "refused our token" in caplog.text
    assert _waiting(wa["org"]) == 4

    account.set_api_token(CW_TOKEN)
    account.save()  # pushes what waits at once
    run_jobs(["chatwoot-inbound"], settle=0)
    assert _mirrored(cw) == _sent_ids(campaign) and _waiting(wa["org"]) == 0


def test_after_a_redis_flush_recover_delivers_the_waiting_mirror(wa, cw, run_jobs, redis_db):
    _account(wa["org"], cw)
    cw.fail_next(10_000, 503)
    campaign = _send(wa, run_jobs, 3)
    assert _waiting(wa["org"]) == 3
    redis_db.flushdb()  # the deferred push is gone with everything else
    cw.reset()
    _long_ago()
    assert recovery.recover()["chatwoot-inbound"] == 1
    run_jobs(["chatwoot-inbound"], settle=0)
    assert _mirrored(cw) == _sent_ids(campaign) and _waiting(wa["org"]) == 0


@pytest.mark.slow
def test_a_worker_killed_mid_mirror_loses_no_mirror(wa, run_jobs, worker_process):
    with ChatwootSandbox(
        accounts={ACCOUNT_ID: CW_TOKEN}, inboxes={INBOX_ID: ACCOUNT_ID}, latency_ms=100
    ) as cw:
        _account(wa["org"], cw)
        campaign = _send(wa, run_jobs, 40, queues=["campaign-trigger", "whatsapp-send"])
        assert _waiting(wa["org"]) == 40
        # One conversation at a time (3 calls of 100 ms each): the push is still going when the
        # first mirror shows, however slow this process is to see it.
        workers = worker_process("--processes", "1", env=child_env(CHATWOOT_PUSH_CONCURRENCY="1"))
        wait_for(lambda: cw.messages(), timeout=120, what="the first mirror in Chatwoot")
        workers.kill()  # SIGKILL mid-push
        assert _waiting(wa["org"]) > 0
        worker_process("--processes", "1")

        def caught_up() -> bool:
            _long_ago()
            recovery.recover()  # the scheduler's every-minute pass
            return _waiting(wa["org"]) == 0

        wait_for(caught_up, timeout=240, interval=2, what="every mirror delivered")
        # Each one at least once (one Chatwoot took as the worker died may be there twice).
        assert sorted(set(_mirrored(cw))) == _sent_ids(campaign)


def test_a_message_chatwoot_rejects_waits_with_its_error_and_the_others_are_mirrored(wa, cw, run_jobs):
    _account(wa["org"], cw)
    campaign = _send(wa, run_jobs, 3, queues=["campaign-trigger", "whatsapp-send"])
    ids = _sent_ids(campaign)
    cw.fail_next(1, 400)  # the first request to arrive (conversations go side by side)
    assert chatwoot_inbound.push(organization_id=wa["org"].pk) == 2
    stuck = _copies(campaign).get(chatwoot_pending=True)
    assert "400" in stuck.chatwoot_error
    assert _mirrored(cw) == [i for i in ids if i != stuck.campaign_message_id]


@pytest.mark.parametrize("account", ["none", "disabled"])
def test_without_an_enabled_chatwoot_account_nothing_is_mirrored(wa, cw, run_jobs, redis_db, account):
    if account == "disabled":
        _account(wa["org"], cw, enabled=False)
    campaign = _send(wa, run_jobs, 3)
    assert campaign.status == Campaign.Status.SENT
    assert not _copies(campaign).exists()
    assert cw.requests() == []
    # and a mirror run by hand for these messages does nothing either
    ids = list(WhatsappMessage.objects.filter(campaign=campaign).values_list("id", flat=True))
    assert tasks.chatwoot_mirror(ids) == 0 and cw.requests() == []


def test_the_chatwoot_token_is_never_in_redis_nor_in_the_database_in_clear(wa, cw, run_jobs, redis_db):
    _account(wa["org"], cw)
    _send(wa, run_jobs, 3)
    cw.fail_next(10_000, 503)  # a second campaign whose mirror waits: deferred pushes in Redis
    wa["customers"](2, start=100)
    lifecycle.campaign_start(campaign=wa["campaign"](name="Second"))
    run_jobs()
    assert _waiting(wa["org"]) == 2
    assert redis_keys_holding(redis_db, CW_TOKEN) == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT api_token_encrypted FROM integrations_chatwootaccount")
        stored = cursor.fetchone()[0]
    assert CW_TOKEN not in stored and stored.startswith("enc1:")


def test_enqueueing_the_mirror_failing_never_fails_the_send(wa, cw, run_jobs, monkeypatch, caplog):
    _account(wa["org"], cw)

    def broken(**kwargs):
        raise ConnectionError("redis is gone")

    monkeypatch.setattr(chatwoot, "chatwoot_enqueue_mirror", broken)
    campaign = _send(wa, run_jobs, 3)
    assert campaign.status == Campaign.Status.SENT
    messages, metric, _ = _send_state(campaign)
    assert {m[1] for m in messages} == {S.SENT} and metric["sent"] == 3
    assert "Chatwoot mirror not enqueued" in caplog.text
    assert cw.requests() == []


# -- the client against the sandbox -----------------------------------------------------------------


def test_the_client_finds_what_it_created(cw, client):
    contact_id, source_id = client.contact_find_or_create(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID)
    assert source_id
    assert client.contact_find_or_create(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID) == (
        contact_id,
        source_id,
    )
    conversation_id = client.conversation_find_or_create(
        contact_id=contact_id, source_id=source_id, inbox_id=INBOX_ID
    )
    assert (
        client.conversation_find_or_create(contact_id=contact_id, source_id=source_id, inbox_id=INBOX_ID)
        == conversation_id
    )
    message_id = client.message_create(
        conversation_id=conversation_id,
        content="olá",
        private=True,
        content_attributes={"campaign_message_id": 9},
    )
    [stored] = cw.messages()
    assert stored["id"] == message_id and stored["conversation_id"] == conversation_id
    assert (stored["phone"], stored["content"], stored["private"]) == (PHONE, "olá", True)
    assert stored["content_attributes"] == {"campaign_message_id": 9}
    assert len(cw.contacts()) == 1 and len(cw.conversations()) == 1
    assert {r["status"] for r in cw.requests()} == {200}


def test_the_client_creates_a_contact_first_and_finds_it_when_the_phone_is_taken(cw, client):
    contact_id, source_id, created = client.contact_create_or_find(
        phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID
    )
    assert created and source_id
    assert client.contact_create_or_find(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID) == (
        contact_id,
        source_id,
        False,
    )
    conversation_id = client.conversation_create(
        contact_id=contact_id, source_id=source_id, inbox_id=INBOX_ID
    )
    assert (
        client.conversation_find_or_create(contact_id=contact_id, source_id=source_id, inbox_id=INBOX_ID)
        == conversation_id
    )
    assert [r["status"] for r in cw.requests()] == [200, 422, 200, 200, 200]
    assert len(cw.contacts()) == 1 and len(cw.conversations()) == 1


def test_the_client_creates_a_conversation_with_its_first_message_in_one_call(cw, client):
    contact_id, source_id, _ = client.contact_create_or_find(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID)
    conversation_id, message_id = client.conversation_create_with_message(
        contact_id=contact_id,
        source_id=source_id,
        inbox_id=INBOX_ID,
        content="[image: foto.jpg image/jpeg] olha",
        private=False,
        message_type="incoming",
        content_attributes={"crm_message_id": 41},
    )
    [stored] = cw.messages()
    assert (stored["id"], stored["conversation_id"]) == (message_id, conversation_id)
    assert (stored["content"], stored["message_type"], stored["private"]) == (
        "[image: foto.jpg image/jpeg] olha",
        0,
        False,
    )
    assert stored["content_attributes"] == {"crm_message_id": 41}
    assert [r["path"].rsplit("/", 1)[-1] for r in cw.requests()] == ["contacts", "conversations"]
    # A message Chatwoot refuses creates no conversation either (one transaction).
    with pytest.raises(IntegrationError) as refused:
        client.conversation_create_with_message(
            contact_id=contact_id, source_id=source_id, inbox_id=INBOX_ID, content=" ", private=True
        )
    assert refused.value.status == 422 and not refused.value.retryable
    assert len(cw.conversations()) == 1 and len(cw.messages()) == 1


def test_the_sandbox_lists_the_messages_stored_after_an_id_with_when_it_took_them(cw, client):
    contact_id, source_id, _ = client.contact_create_or_find(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID)
    before = time.time()
    conversation_id, first = client.conversation_create_with_message(
        contact_id=contact_id, source_id=source_id, inbox_id=INBOX_ID, content="um", private=False
    )
    second = client.message_create(conversation_id=conversation_id, content="dois", private=False)

    def after(message_id: int) -> list[dict]:
        return httpx.get(f"{cw.url}/_sandbox/messages", params={"after": message_id}).json()["messages"]

    listed = after(0)
    assert [(m["id"], m["content"], m["phone"]) for m in listed] == [
        (first, "um", PHONE),
        (second, "dois", PHONE),
    ]
    assert before <= listed[0]["received_at"] <= listed[1]["received_at"] <= time.time()
    assert [m["id"] for m in after(first)] == [second] and after(second) == []
    assert httpx.get(f"{cw.url}/_sandbox/messages", params={"after": "x"}).status_code == 400


def test_the_client_matches_the_exact_phone_and_reuses_a_contact_an_agent_created(cw, client):
    agent_made = cw.create_contact(ACCOUNT_ID, PHONE, "Ana (loja)")
    other = cw.create_contact(ACCOUNT_ID, PHONE + "9", "Someone else")  # a substring match of PHONE
    contact_id, source_id = client.contact_find_or_create(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID)
    assert contact_id == agent_made != other
    assert source_id is None  # no entry in our inbox yet: Chatwoot makes one with the conversation
    conversation_id = client.conversation_find_or_create(
        contact_id=contact_id, source_id=None, inbox_id=INBOX_ID
    )
    [conversation] = cw.conversations()
    assert conversation["id"] == conversation_id and conversation["contact_inbox"]["source_id"]


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (500, True),
        (502, True),
        (503, True),
        (429, True),
        (400, False),
        (403, False),
        (404, False),
        (422, False),
    ],
)
def test_the_client_maps_http_errors_to_retryable_or_not(cw, client, status, retryable):
    cw.fail_next(1, status)
    with pytest.raises(IntegrationError) as failure:
        client.contact_find_or_create(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID)
    assert (failure.value.status, failure.value.retryable) == (status, retryable)
    # only the next request was failed
    assert client.contact_find_or_create(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID)[0] > 0


def test_a_bad_token_is_a_401_that_is_not_retryable(cw):
    with (
        ChatwootClient(base_url=cw.url, account_id=ACCOUNT_ID, api_token="wrong") as bad,
        pytest.raises(IntegrationError) as failure,
    ):
        bad.contact_find_or_create(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID)
    assert (failure.value.status, failure.value.retryable) == (401, False)
    assert "Invalid Access Token" in failure.value.details
    assert "wrong" not in str(failure.value) + failure.value.details


def test_another_accounts_id_is_a_401_and_unknown_ids_are_404s(cw, client):
    with (
        ChatwootClient(base_url=cw.url, account_id=ACCOUNT_ID + 1, api_token=CW_TOKEN) as elsewhere,
        pytest.raises(IntegrationError) as failure,
    ):
        elsewhere.message_create(conversation_id=1, content="x", private=False)
    assert (failure.value.status, failure.value.retryable) == (401, False)
    for call in (
        lambda: client.message_create(conversation_id=999, content="x", private=False),
        lambda: client.conversation_find_or_create(contact_id=999, source_id=None, inbox_id=INBOX_ID),
        lambda: client.contact_find_or_create(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID + 1),
    ):
        with pytest.raises(IntegrationError) as failure:
            call()
        assert (failure.value.status, failure.value.retryable) == (404, False)


def test_a_timeout_and_a_refused_connection_are_retryable(cw):
    cw.set_latency(500)
    timeout = httpx.Timeout(connect=1.0, read=0.1, write=1.0, pool=1.0)
    with (
        ChatwootClient(base_url=cw.url, account_id=ACCOUNT_ID, api_token=CW_TOKEN, timeout=timeout) as slow,
        pytest.raises(IntegrationError) as failure,
    ):
        slow.contact_find_or_create(phone_e164=PHONE, name="Ana", inbox_id=INBOX_ID)
    assert failure.value.retryable and "timed out" in str(failure.value)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with (
            ChatwootClient(base_url=f"http://127.0.0.1:{port}", account_id=1, api_token="t") as nowhere,
            pytest.raises(IntegrationError) as failure,
        ):
            nowhere.message_create(conversation_id=1, content="x", private=False)
    assert failure.value.retryable and failure.value.status is None


def test_both_shapes_of_a_contact_creation_answer_are_understood():
    inbox = {"id": INBOX_ID, "channel_type": "Channel::Api"}
    current = {"payload": {"contact": {"id": 5}, "contact_inbox": {"inbox": inbox, "source_id": "s-1"}}}
    older = {
        "payload": {
            "contact": {"id": 5},
            "contact_inboxes": [
                {"inbox": {"id": INBOX_ID + 1}, "source_id": "other"},
                {"inbox": inbox, "source_id": "s-2"},
            ],
        }
    }
    assert parse_contact_create(current, INBOX_ID) == (5, "s-1")
    assert parse_contact_create(older, INBOX_ID) == (5, "s-2")
    assert parse_contact_create({"payload": {"contact": {"id": 5}}}, INBOX_ID) == (5, None)
    with pytest.raises(IntegrationError) as failure:
        parse_contact_create({"payload": []}, INBOX_ID)
    assert not failure.value.retryable
