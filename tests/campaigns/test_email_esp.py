"""Email campaigns through an ESP (django-anymail) end to end: real PostgreSQL, Redis and workers, a
loopback stand-in for Postmark's API, and Postmark's tracking webhooks posted to anymail's view."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from email.message import EmailMessage as MimeMessage

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.utils import timezone

from campaigns import inbox as campaign_inbox
from campaigns import lifecycle, links, selectors
from campaigns.models import BodyFormat, Campaign, CampaignMetric, Channel, EmailMessage
from crm import inbox, jobs, promote, queues, recovery
from crm.models import Customer, InboxEvent, OptOutSource, Organization, Store
from integrations.email import esp
from integrations.email.bounces import Failure
from integrations.models import EmailSettings
from messaging.models import EmailSuppression
from project.sandboxes.esp import (
    PostmarkSandbox,
    bounce_event,
    click_event,
    delivery_event,
    open_event,
    spam_complaint_event,
    subscription_change_event,
)
from tests.campaigns.test_esp_intake import applied_from_inbox
from tests.conftest import redis_keys_holding, wait_for

S = EmailMessage.Status
TOKEN = "pm-server-t0ken-n40-vaza-0123456789"
WEBHOOK_SECRET = "postmark:hook-s3cret-0123"
TRACKING = "/anymail/postmark/tracking/"

BODY = """<mjml><mj-body><mj-section><mj-column>
<mj-text>Olá {{ first_name }}, ofertas na {{ store_name }}!</mj-text>
<mj-button href="https://loja.example.com.br/bf?utm=email&amp;x=1">Ver ofertas</mj-button>
<mj-text><a href="https://loja.example.com.br/bf?utm=email&amp;x=1">de novo</a>
<a href="{{ unsubscribe_url }}">Descadastrar</a></mj-text>
</mj-column></mj-section></mj-body></mjml>"""


@pytest.fixture
def postmark() -> Iterator[PostmarkSandbox]:
    with PostmarkSandbox(server_tokens={TOKEN}) as server:
        yield server


@pytest.fixture
def em(transactional_db, postmark, settings) -> dict:
    """An organization whose email goes through Postmark (the stand-in), and a campaign factory."""
    settings.EMAIL_BATCH_SIZE = 50
    settings.EMAIL_RETRY_BACKOFF = 0.5
    settings.PUBLIC_URL = "https://crm.example.com.br"
    settings.ANYMAIL = {"WEBHOOK_SECRET": WEBHOOK_SECRET}
    org = Organization.objects.create(name="Loja Teste", slug="teste")
    store = Store.objects.create(organization=org, erp_code="001", name="Centro")
    email_settings = EmailSettings(
        organization=org,
        provider=EmailSettings.Provider.POSTMARK,
        esp_api_url=postmark.url,
        sender_name="Loja Teste",
        sender_email="ofertas@loja.example.com.br",
        unsubscribe_mailto="sair@loja.example.com.br",
        messages_per_minute=0,
    )
    email_settings.set_esp_api_key(TOKEN)
    email_settings.save()

    def customers(n: int, start: int = 0) -> list[Customer]:
        return Customer.objects.bulk_create(
            [
                Customer(
                    marketing_consent=True,
                    organization=org,
                    erp_id=f"C{i}",
                    name=f"Cliente{i} Silva",
                    email=f"c{i}@example.com.br",
                )
                for i in range(start, start + n)
            ]
        )

    def campaign(**fields) -> Campaign:
        defaults = dict(
            organization=org,
            name="Black Friday",
            channel=Channel.EMAIL,
            email_subject="{{ first_name }}, a Black Friday chegou",
            email_body_format=BodyFormat.MJML,
            email_body=BODY,
        )
        return Campaign.objects.create(**{**defaults, **fields})

    return {
        "org": org,
        "store": store,
        "settings": email_settings,
        "customers": customers,
        "campaign": campaign,
    }


def _statuses(campaign: Campaign) -> dict[str, int]:
    counts = selectors.campaign_counts(campaign_id=campaign.pk, channel=Channel.EMAIL)
    return {k: v for k, v in counts.items() if v}


def _metric(campaign: Campaign) -> tuple[int, int, int, int, int]:
    m = CampaignMetric.objects.get(campaign=campaign)
    return (m.sent, m.delivered, m.bounced, m.opened, m.clicked)


def _auth(secret: str = WEBHOOK_SECRET) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(secret.encode()).decode()}


def _post(payload: dict, **auth) -> int:
    """POST to Postmark's tracking URL, then apply what it accepted into the inbox, as a worker would."""
    response = Client().post(TRACKING, data=json.dumps(payload), content_type="application/json", **auth)
    applied_from_inbox()
    return response.status_code


def _sent_campaign(em, n: int, run_jobs) -> tuple[Campaign, list[Customer], list[EmailMessage]]:
    people = em["customers"](n)
    campaign = lifecycle.campaign_start(campaign=em["campaign"]())
    run_jobs()
    assert _statuses(campaign) == {"sent": n}
    messages = [EmailMessage.objects.get(customer=p) for p in people]
    return campaign, people, messages


# --- sending --------------------------------------------------------------------------------------


def test_a_postmark_campaign_sends_every_message_through_the_api_and_stores_its_id(em, postmark, run_jobs):
    people = em["customers"](4)
    campaign = lifecycle.campaign_start(campaign=em["campaign"]())
    run_jobs()
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT
    assert _statuses(campaign) == {"sent": 4}
    assert _metric(campaign) == (4, 4, 0, 0, 0)
    requests = postmark.requests()
    assert len(requests) == 4 and {r["status"] for r in requests} == {200}
    assert {r["token"] for r in requests} == {TOKEN}

    msg = EmailMessage.objects.get(customer=people[0])
    (received,) = postmark.messages(to=people[0].email)
    assert msg.esp_message_id == received["MessageID"]
    assert msg.smtp_reply == f"Postmark sent: {received['MessageID']}"
    assert received["From"] == "Loja Teste <ofertas@loja.example.com.br>"
    assert received["To"] == f"Cliente0 Silva <{people[0].email}>"
    assert received["Subject"] == "Cliente0, a Black Friday chegou"
    assert received["MessageStream"] == "broadcast"  # marketing mail on Postmark's bulk stream
    html, text = received["HtmlBody"], received["TextBody"]
    click = f"https://crm.example.com.br/{links.link_path('r', msg)}/0"
    unsubscribe = f"https://crm.example.com.br/{links.link_path('u', msg)}"
    assert "Olá Cliente0, ofertas na Loja Teste!" in html
    assert html.count(click) == 2 and "loja.example.com.br/bf" not in html  # every link tracked
    assert f"https://crm.example.com.br/{links.link_path('o', msg)}" in html
    assert unsubscribe in html
    assert "Olá Cliente0" in text and "<html" not in text
    headers = {h["Name"]: h["Value"] for h in received["Headers"]}
    assert (
        headers["List-Unsubscribe"]
        == f"<{unsubscribe}>, <mailto:sair@loja.example.com.br?subject=unsubscribe>"
    )
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert headers["Message-ID"].endswith("@loja.example.com.br>")
    # the API's own fields are not repeated as headers
    assert not {"From", "To", "Subject", "Content-Type", "MIME-Version"} & set(headers)
    ids = set(EmailMessage.objects.values_list("esp_message_id", flat=True))
    assert ids == {m["MessageID"] for m in postmark.messages()}


def test_the_api_key_is_encrypted_at_rest_and_never_in_redis_or_the_logs(
    em, postmark, run_jobs, redis_db, caplog
):
    caplog.set_level(logging.DEBUG)
    em["customers"](3)
    EmailSettings.objects.filter(pk=em["settings"].pk).update(messages_per_minute=600)  # the limiter too
    lifecycle.campaign_start(campaign=em["campaign"]())
    run_jobs()
    assert {r["token"] for r in postmark.requests()} == {TOKEN} and len(postmark.messages()) == 3
    with connection.cursor() as cursor:
        cursor.execute("SELECT esp_api_key_encrypted FROM integrations_emailsettings")
        (stored,) = cursor.fetchone()
        assert stored and TOKEN not in stored
        cursor.execute(
            "SELECT count(*) FROM integrations_emailsettings AS s WHERE s::text LIKE %s",
            [f"%{TOKEN}%"],
        )
        assert cursor.fetchone()[0] == 0
    assert EmailSettings.objects.get().get_esp_api_key() == TOKEN
    assert redis_keys_holding(redis_db, TOKEN) == []
    assert TOKEN not in caplog.text
    assert TOKEN not in repr(esp.EspAccount(provider="postmark", api_key=TOKEN))


def test_the_rate_limit_paces_the_api_calls(em, postmark, run_jobs):
    em["customers"](11)
    EmailSettings.objects.filter(pk=em["settings"].pk).update(messages_per_minute=1200)  # 20/s
    before = time.time()
    lifecycle.campaign_start(campaign=em["campaign"]())
    run_jobs()
    received = sorted(r["received_at"].timestamp() for r in postmark.requests())
    assert len(received) == 11
    # Each call waits for a slot of its own, booked after `before`, 50 ms apart: the eleventh slot
    # starts at least 10 intervals after the first, however late any call arrives after its slot.
    assert received[-1] - before >= 10 * 0.05 - 0.005  # 5 ms for the clocks' granularity


def test_a_bad_api_key_pauses_the_organization_and_leaves_the_messages_queued(em, postmark, run_jobs):
    em["customers"](3)
    em["settings"].set_esp_api_key("a-revoked-token")
    em["settings"].save()
    campaign = lifecycle.campaign_start(campaign=em["campaign"]())
    run_jobs()
    org = Organization.objects.get(pk=em["org"].pk)
    assert org.email_paused_at is not None
    assert org.email_paused_reason == "401 Postmark error 10: Bad or missing Server API token."
    assert _statuses(campaign) == {"queued": 3}
    assert set(EmailMessage.objects.values_list("attempts", flat=True)) == {0}
    assert not EmailSuppression.objects.exists() and not postmark.messages()
    # only the calls already in flight when the first 401 came back (one per sender thread)
    assert 1 <= len(postmark.requests()) <= 3
    assert "401" in selectors.campaign_status(campaign=campaign)["sending_paused"]

    # the operator fixes the key and clears the pause: the deferred batch goes out
    em["settings"].set_esp_api_key(TOKEN)
    em["settings"].save()
    Organization.objects.filter(pk=org.pk).update(email_paused_at=None, email_paused_reason="")
    lifecycle.requeue_unfinished_batches(campaign_id=campaign.pk)
    run_jobs()
    assert _statuses(campaign) == {"sent": 3}
    assert set(EmailMessage.objects.values_list("attempts", flat=True)) == {1}


def test_any_other_refusal_of_the_api_pauses_with_the_esps_own_words(em, run_jobs):
    em["customers"](2)
    with PostmarkSandbox(server_tokens={TOKEN}, sender_signatures={"outro@loja.example.com.br"}) as strict:
        EmailSettings.objects.filter(pk=em["settings"].pk).update(esp_api_url=strict.url)
        campaign = lifecycle.campaign_start(campaign=em["campaign"]())
        run_jobs()
        assert not strict.messages()
    org = Organization.objects.get(pk=em["org"].pk)
    assert org.email_paused_reason.startswith(
        "422 Postmark error 400: The 'From' address you supplied (ofertas@loja.example.com.br) is not a "
        "Sender Signature on your account."
    )
    assert _statuses(campaign) == {"queued": 2}
    assert not EmailSuppression.objects.exists()


def test_an_inactive_recipient_is_a_hard_bounce_and_is_suppressed(em, postmark, run_jobs):
    good, dead = em["customers"](2)
    postmark.deactivate(dead.email)
    first = lifecycle.campaign_start(campaign=em["campaign"]())
    run_jobs()
    msg = EmailMessage.objects.get(campaign=first, customer=dead)
    assert (msg.status, msg.bounce_type, msg.attempts, msg.esp_message_id) == (S.BOUNCED, "hard", 1, None)
    assert msg.bounce_message.startswith("422 Postmark error 406: You tried to send to recipient(s) that")
    assert dead.email in msg.bounce_message
    suppression = EmailSuppression.objects.get(organization=em["org"])
    assert (suppression.email, suppression.reason) == (dead.email, "hard_bounce")
    assert _metric(first) == (1, 1, 1, 0, 0)
    first.refresh_from_db()
    assert first.status == Campaign.Status.SENT
    assert Organization.objects.get(pk=em["org"].pk).email_paused_at is None

    second = lifecycle.campaign_start(campaign=em["campaign"](name="Natal"))
    run_jobs()
    assert list(EmailMessage.objects.filter(campaign=second).values_list("customer_id", flat=True)) == [
        good.pk
    ]
    assert len(postmark.messages(to=dead.email)) == 0


@pytest.mark.parametrize("outage", ["503", "500", "429", "unreachable"])
def test_an_unavailable_api_keeps_messages_queued_and_the_batch_deferred_until_it_recovers(
    em, postmark, run_jobs, settings, outage
):
    settings.EMAIL_RETRY_BACKOFF = 60.0  # never due while the test runs: it promotes the batch itself
    em["customers"](3)
    if outage == "503":
        postmark.fail(503, times=None)  # a plain-text answer, as a load balancer gives
    elif outage == "500":
        postmark.fail(500, 0, "Internal server error", times=None)
    elif outage == "429":
        postmark.fail(429, 0, "Rate limit exceeded", times=None)
    else:
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            closed = f"http://127.0.0.1:{s.getsockname()[1]}"
        EmailSettings.objects.filter(pk=em["settings"].pk).update(esp_api_url=closed)
    campaign = lifecycle.campaign_start(campaign=em["campaign"]())
    run_jobs(settle=0.5)  # returns once the batch waits for its backoff

    assert _statuses(campaign) == {"queued": 3}
    assert set(EmailMessage.objects.values_list("attempts", flat=True)) == {0}  # no attempt spent
    assert Organization.objects.get(pk=em["org"].pk).email_paused_at is None  # not the sender's fault
    assert not EmailSuppression.objects.exists() and not postmark.messages()
    # none reached an unreachable API; else only those in flight together (one per sender thread)
    assert (len(postmark.requests()) == 0) == (outage == "unreachable") and len(postmark.requests()) <= 3
    due = promote.seconds_until_next_due(["email-send"])
    assert due is not None and 0 < due <= 60.0  # deferred by EMAIL_RETRY_BACKOFF, not failed

    postmark.reset()  # the API is back
    EmailSettings.objects.filter(pk=em["settings"].pk).update(esp_api_url=postmark.url)
    deferred = [j.decode() for j in jobs.get_connection().zrange("rq:scheduled:email-send", 0, -1)]
    assert len(deferred) == 1 and promote.promote_now("email-send", deferred) == 1  # its time has come
    run_jobs(settle=0)
    assert _statuses(campaign) == {"sent": 3}
    assert set(EmailMessage.objects.values_list("attempts", flat=True)) == {1}
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT


def test_a_request_that_gets_no_answer_is_an_unknown_outcome_not_a_retry(postmark):
    """The ESP may have accepted it (here it did), so the job must not send it again."""
    message = MimeMessage()
    message["From"], message["To"], message["Subject"] = "ofertas@loja.example.com.br", "c@example.com", "Oi"
    message.set_content("Olá")
    postmark.set_latency(1000)
    result = esp.send(provider="postmark", api_key=TOKEN, api_url=postmark.url, message=message, timeout=0.3)
    assert result.unknown.startswith("Postmark: no answer after the request was sent: ReadTimeout")
    assert not (result.failure or result.transient or result.message_id or result.sent)
    assert len(postmark.messages(to="c@example.com")) == 1


def test_anymail_exceptions_are_classified_for_the_job():
    """Pure logic: what the job does with each kind of refusal."""
    from anymail.exceptions import AnymailInvalidAddress, AnymailUnsupportedFeature

    bad_to = AnymailInvalidAddress("Invalid email address 'x@' parsed from 'x@' in `to`.")
    failure = esp.classify(bad_to, esp_name="Brevo").failure
    assert failure is not None and failure.kind is Failure.HARD_BOUNCE
    bad_from = AnymailInvalidAddress("Invalid email address 'x@' parsed from 'x@' in `from_email`.")
    failure = esp.classify(bad_from, esp_name="Brevo").failure
    assert failure is not None and failure.kind is Failure.SENDER  # never bounce everyone for it
    refused = AnymailUnsupportedFeature("Brevo does not support merge_data without template_id")
    failure = esp.classify(refused, esp_name="Brevo").failure
    assert failure is not None and failure.kind is Failure.SENDER
    assert failure.message == "Brevo: Brevo does not support merge_data without template_id"
    with pytest.raises(ValueError, match="unknown email provider"):
        esp.backend_for(provider="smtp", api_key="x")


# --- tracking webhooks ----------------------------------------------------------------------------


def test_a_bounce_webhook_bounces_the_message_hard_once(em, postmark, run_jobs):
    campaign, people, (a, b) = _sent_campaign(em, 2, run_jobs)
    assert _post(delivery_event(message_id=a.esp_message_id, recipient=a.email), **_auth()) == 200
    assert _metric(campaign) == (2, 2, 0, 0, 0)  # delivered was counted at send

    payload = bounce_event(message_id=a.esp_message_id, recipient=a.email)
    assert _post(payload, **_auth()) == 200
    assert _post(payload, **_auth()) == 200  # Postmark retries: counted once
    a.refresh_from_db()
    assert (a.status, a.bounce_type) == (S.BOUNCED, "hard") and a.failed_at
    assert a.bounce_message.startswith("Postmark HardBounce: The server was unable to deliver")
    assert "5.1.1" in a.bounce_message
    suppression = EmailSuppression.objects.get()
    assert (suppression.email, suppression.reason) == (people[0].email, "hard_bounce")
    assert _metric(campaign) == (2, 1, 1, 0, 0)
    assert _statuses(campaign) == {"sent": 1, "bounced": 1}

    # a soft bounce (Postmark reports it as a Bounce too) is only noted; the address still works
    soft = bounce_event(
        message_id=b.esp_message_id,
        recipient=b.email,
        kind="SoftBounce",
        type_code=4096,
        details="452 4.2.2 full",
    )
    assert _post(soft, **_auth()) == 200
    b.refresh_from_db()
    assert b.status == S.SENT and "SoftBounce" in b.bounce_message and "4.2.2" in b.bounce_message
    assert EmailSuppression.objects.count() == 1 and _metric(campaign) == (2, 1, 1, 0, 0)


def test_a_bounce_that_arrives_before_its_send_is_recorded_is_applied_once_it_is(
    em, postmark, run_jobs, monkeypatch
):
    """A chunk is recorded after its last send (seconds at the organization's rate); the ESP's
    bounce for its first message can come before that. It is kept in the inbox and applied at its
    first retry after the record (the delayed drain the keeping scheduled)."""
    monkeypatch.setattr(inbox, "RETRY_DELAY", 0.5)  # retried 0.5 s, 1 s, 2 s… later: not 5 s
    EmailSettings.objects.filter(pk=em["settings"].pk).update(messages_per_minute=60)  # a chunk of 3: 2 s
    em["customers"](3)
    campaign = lifecycle.campaign_start(campaign=em["campaign"]())
    seen: dict[str, object] = {}

    # Postmark holds its answer to the first send (not past the client's 30 s read timeout) until
    # the bounce was posted: the chunk cannot be recorded before, however slow the machine.
    postmark.set_latency(25_000)

    def bounce_the_first_as_soon_as_it_is_sent() -> None:
        try:
            wait_for(lambda: postmark.messages(), timeout=25, interval=0.005, what="the first send")
            first = postmark.messages()[0]
            seen["recorded"] = EmailMessage.objects.filter(esp_message_id=first["MessageID"]).exists()
            seen["status"] = _post(
                bounce_event(message_id=first["MessageID"], recipient=first["_to"][0]), **_auth()
            )
            seen["still_unknown"] = not EmailMessage.objects.filter(
                esp_message_id=first["MessageID"]
            ).exists()
            seen["id"] = first["MessageID"]
        finally:
            postmark.set_latency(0)
            connection.close()

    webhook = threading.Thread(target=bounce_the_first_as_soon_as_it_is_sent)
    webhook.start()
    run_jobs()
    webhook.join(timeout=120)

    assert seen["recorded"] is False and seen["status"] == 200 and seen["still_unknown"] is True, seen
    for _ in range(inbox.RETRY_ATTEMPTS):  # each retry's drain is a delayed job on the inbox queue
        if not inbox.pending(campaign_inbox.ESP):
            break
        run_jobs([queues.INBOX], settle=inbox.RETRY_MAX_DELAY)
    bounced = EmailMessage.objects.get(esp_message_id=seen["id"])
    assert (bounced.status, bounced.bounce_type) == (S.BOUNCED, "hard")
    assert EmailSuppression.objects.get().email == bounced.email
    assert _statuses(campaign) == {"sent": 2, "bounced": 1}
    assert _metric(campaign) == (3, 2, 1, 0, 0)
    assert inbox.pending() == 0 and not InboxEvent.objects.exists()  # applied, forgotten


SPAMCOP = "554 5.7.1 Service unavailable; Client host [167.89.55.66] blocked using bl.spamcop.net"
MAILGUN_SIGNING_KEY = "mailgun-signing-key-0123456789"


def _sendgrid_bounce(message: EmailMessage, *, kind: str, reason: str) -> list[dict]:
    """SendGrid's event webhook body for one bounce (`kind` "bounce" or "blocked"), as it posts it."""
    return [
        {
            "email": message.email,
            "timestamp": 1526923399,
            "event": "bounce",
            "ip": "167.89.55.66",
            "reason": reason,
            "status": reason.split()[1],
            "sg_event_id": f"B977-{message.pk}",
            "sg_message_id": f"grsqQC4hRxKgKG-{message.pk}.filter0001p2iad2",
            "smtp-id": f"<grsqQC4hRxKgKG-{message.pk}@ismtpd0046p1mdw1.sendgrid.net>",
            "tls": 1,
            "type": kind,
            "anymail_id": message.esp_message_id,
        }
    ]


def _mailgun_failed(message_id: str, recipient: str, *, reason: str, token: str) -> dict:
    """Mailgun's signed webhook body for a permanent failure with that `reason`."""
    timestamp = str(int(time.time()))
    signature = hmac.new(MAILGUN_SIGNING_KEY.encode(), f"{timestamp}{token}".encode(), hashlib.sha256)
    return {
        "signature": {"timestamp": timestamp, "token": token, "signature": signature.hexdigest()},
        "event-data": {
            "event": "failed",
            "severity": "permanent",
            "reason": reason,
            "recipient": recipient,
            "timestamp": time.time(),
            "id": f"ev-{token}",
            "message": {"headers": {"message-id": message_id.strip("<>")}},
            "delivery-status": {
                "code": 554,
                "message": "5.7.1 [203.0.113.9] Blocked - see https://ipcheck.proofpoint.com/",
                "description": "",
            },
        },
    }


def test_esp_block_events_mark_the_message_blocked_and_never_suppress(em, postmark, run_jobs, settings):
    campaign, people, (a, b, c) = _sent_campaign(em, 3, run_jobs)
    # b as if sent through Mailgun, which names messages by their Message-ID
    EmailMessage.objects.filter(pk=b.pk).update(esp_message_id="<20261201.1@mg.loja.example.com.br>")
    b.refresh_from_db()

    def post(path: str, payload: object) -> int:
        body = json.dumps(payload)
        auth = _auth()["HTTP_AUTHORIZATION"]
        response = Client().post(path, data=body, content_type="application/json", HTTP_AUTHORIZATION=auth)
        applied_from_inbox()
        return response.status_code

    sendgrid_blocked = _sendgrid_bounce(a, kind="blocked", reason=SPAMCOP)
    assert post("/anymail/sendgrid/tracking/", sendgrid_blocked) == 200
    assert post("/anymail/sendgrid/tracking/", sendgrid_blocked) == 200  # SendGrid retries: counted once
    mailgun = _mailgun_failed(b.esp_message_id, b.email, reason="espblock", token="a" * 50)
    # Mailgun signs with a key of the organization's account: its URL names the organization
    em["settings"].provider = EmailSettings.Provider.MAILGUN
    em["settings"].set_esp_webhook_key(MAILGUN_SIGNING_KEY)
    em["settings"].save()
    assert post(f"/anymail/mailgun/tracking/{em['org'].pk}/", mailgun) == 200
    em["settings"].provider = EmailSettings.Provider.POSTMARK  # the campaigns below send through Postmark
    em["settings"].save()
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.status, a.bounce_type) == (S.BLOCKED, "") and a.failed_at
    assert a.bounce_message.startswith("SendGrid blocked:") and "spamcop" in a.bounce_message
    assert (b.status, b.bounce_type) == (S.BLOCKED, "") and b.bounce_message.startswith("Mailgun espblock:")
    assert not EmailSuppression.objects.exists()
    assert CampaignMetric.objects.get(campaign=campaign).blocked == 2
    assert _metric(campaign) == (3, 1, 0, 0, 0)  # sent, delivered, bounced, opened, clicked
    assert _statuses(campaign) == {"sent": 1, "blocked": 2}

    # a SendGrid bounce of type "bounce" is still a hard bounce: suppressed
    hard = _sendgrid_bounce(
        c, kind="bounce", reason="550 5.1.1 The email account that you tried to reach does not exist"
    )
    assert post("/anymail/sendgrid/tracking/", hard) == 200
    c.refresh_from_db()
    assert (c.status, c.bounce_type) == (S.BOUNCED, "hard")
    assert list(EmailSuppression.objects.values_list("email", flat=True)) == [people[2].email]

    # the next campaign writes to the blocked addresses again (the 24-hour block off: it is not the point)
    Organization.objects.filter(pk=em["org"].pk).update(block_multiple_campaigns=False)
    second = lifecycle.campaign_start(campaign=em["campaign"](name="Natal"))
    run_jobs()
    assert _statuses(second) == {"sent": 2}


def _post_early_block(message: EmailMessage, early_id: str) -> InboxEvent:
    """SendGrid's block of `message` under an ESP id not recorded yet, together with an open of
    `message` under its own id, in one webhook; drained: the open applied, the block kept."""
    ahead = _sendgrid_bounce(message, kind="blocked", reason=SPAMCOP)
    ahead[0]["anymail_id"] = early_id
    opened = {**ahead[0], "event": "open", "sg_event_id": "O1", "anymail_id": message.esp_message_id}
    del opened["reason"], opened["type"], opened["status"]
    body = json.dumps([opened, *ahead])
    auth = _auth()["HTTP_AUTHORIZATION"]
    response = Client().post(
        "/anymail/sendgrid/tracking/", data=body, content_type="application/json", HTTP_AUTHORIZATION=auth
    )
    assert response.status_code == 200 and applied_from_inbox() == 1
    kept = InboxEvent.objects.get()
    assert kept.failed_at is None and kept.retries == 1
    assert kept.not_before is not None and kept.not_before > timezone.now()
    assert [e["anymail_id"] for e in json.loads(kept.payload)["events"]] == [early_id]  # the open is done
    assert applied_from_inbox() == 0  # not due yet
    return kept


def _due(event: InboxEvent, ago: timedelta = timedelta(0)) -> None:
    """Time passes: the event's retry is due (`ago` ago)."""
    InboxEvent.objects.filter(pk=event.pk).update(not_before=timezone.now() - ago)


def test_a_block_event_that_arrives_before_its_send_is_recorded_is_applied_as_a_block(em, postmark, run_jobs):
    campaign, _people, (a,) = _sent_campaign(em, 1, run_jobs)
    early_id = "11111111-2222-3333-4444-555555555555"
    kept = _post_early_block(a, early_id)
    a.refresh_from_db()
    assert a.status == S.SENT and a.opened_at is not None
    # still not recorded at the first retry: kept again, later
    _due(kept)
    assert applied_from_inbox() == 1
    kept.refresh_from_db()
    assert kept.retries == 2 and kept.not_before > timezone.now() and kept.failed_at is None
    # its send is recorded now (as the send job does), and the next retry applies it
    EmailMessage.objects.filter(pk=a.pk).update(esp_message_id=early_id)
    _due(kept)
    assert applied_from_inbox() == 1
    a.refresh_from_db()
    assert a.status == S.BLOCKED and not EmailSuppression.objects.exists()
    assert CampaignMetric.objects.get(campaign=campaign).blocked == 1
    assert not InboxEvent.objects.exists()


def test_an_early_event_outlives_redis_and_is_applied_once_its_send_is_recorded(em, postmark, run_jobs):
    """The kept event is in PostgreSQL: Redis flushed while it waits (its retry's delayed drain
    lost with it), the recovery pass's sweep drains it once due, and it is applied."""
    campaign, _people, (a,) = _sent_campaign(em, 1, run_jobs)
    early_id = "22222222-3333-4444-5555-666666666666"
    kept = _post_early_block(a, early_id)
    jobs.get_connection().flushdb()  # Redis restarted without persistence
    EmailMessage.objects.filter(pk=a.pk).update(esp_message_id=early_id)  # the send is recorded
    assert recovery.recover()["inbox"] == 0  # not due: left alone
    _due(kept, ago=inbox.SWEEP_AFTER * 2)  # due, and its wake-up never came
    assert recovery.recover()["inbox"] == 1
    run_jobs([queues.INBOX], settle=0)
    a.refresh_from_db()
    assert a.status == S.BLOCKED and CampaignMetric.objects.get(campaign=campaign).blocked == 1
    assert inbox.pending() == 0 and not InboxEvent.objects.exists()


def test_an_event_for_a_message_never_recorded_is_set_aside_after_the_last_retry(
    em, postmark, run_jobs, caplog
):
    """Another system sending through the same ESP account: its ids are never ours. The event is
    retried RETRY_ATTEMPTS times (with growing delays), then set aside with the reason."""
    campaign, _people, (a,) = _sent_campaign(em, 1, run_jobs)
    kept = _post_early_block(a, "not-ours-0001")
    for _ in range(inbox.RETRY_ATTEMPTS):
        _due(kept)
        with caplog.at_level(logging.ERROR, logger="crm.inbox"):
            assert applied_from_inbox() == 1
        kept.refresh_from_db()
    assert kept.failed_at is not None and kept.retries == inbox.RETRY_ATTEMPTS
    assert "given up after 12 retries" in kept.error and "not-ours-0001" in kept.error
    assert f"esp event {kept.pk} set aside" in caplog.text
    assert [inbox.retry_delay(n) for n in (1, 2, 3, inbox.RETRY_ATTEMPTS)] == [5, 10, 20, 600]
    assert inbox.pending() == 0 and applied_from_inbox() == 0  # never drained again
    a.refresh_from_db()
    assert a.status == S.SENT and CampaignMetric.objects.get(campaign=campaign).blocked == 0


def test_a_spam_complaint_suppresses_the_address_and_opts_the_customer_out(em, postmark, run_jobs):
    campaign, people, (a, b) = _sent_campaign(em, 2, run_jobs)
    payload = spam_complaint_event(message_id=a.esp_message_id, recipient=a.email)
    assert _post(payload, **_auth()) == 200
    assert _post(payload, **_auth()) == 200
    suppression = EmailSuppression.objects.get()
    assert (suppression.email, suppression.reason) == (people[0].email, "complaint")
    person = Customer.objects.get(pk=people[0].pk)
    assert person.email_opted_out_at is not None and person.email_opt_out_source == "provider"
    assert person.whatsapp_opted_out_at is None  # only email
    a.refresh_from_db()
    assert a.status == S.SENT  # it was delivered; the complaint is about the customer
    assert _metric(campaign) == (2, 2, 0, 0, 0)

    # an unsubscribe through Postmark's own link opts out without suppressing
    assert _post(subscription_change_event(message_id=b.esp_message_id, recipient=b.email), **_auth()) == 200
    other = Customer.objects.get(pk=people[1].pk)
    assert other.email_opted_out_at is not None and other.email_opt_out_source == "provider"
    assert EmailSuppression.objects.count() == 1

    # the next campaign leaves both out: nobody would receive it, so it does not start
    second = em["campaign"](name="Natal")
    with pytest.raises(lifecycle.EmptyAudience):
        lifecycle.campaign_start(campaign=second)
    run_jobs()
    assert not EmailMessage.objects.filter(campaign=second).exists()
    assert len(postmark.messages()) == 2


def test_opens_and_clicks_from_webhooks_are_counted_once(em, postmark, run_jobs):
    campaign, _people, (a, b) = _sent_campaign(em, 2, run_jobs)
    opened = open_event(message_id=a.esp_message_id, recipient=a.email)
    clicked = click_event(
        message_id=b.esp_message_id,
        recipient=b.email,
        original_link=f"https://crm.example.com.br/{links.link_path('r', b)}/0",
    )
    for payload in (opened, opened, clicked, clicked):
        assert _post(payload, **_auth()) == 200
    # our own pixel for the same open changes nothing either
    Client().get(f"/{links.link_path('o', a)}")
    assert _metric(campaign)[3:] == (2, 1)  # b's click counts as its open
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.opened_at and not a.clicked_at and b.opened_at and b.clicked_at


def test_webhooks_without_the_secret_are_refused_and_unknown_ids_ignored(
    em, postmark, run_jobs, settings, caplog
):
    campaign, _people, (a,) = _sent_campaign(em, 1, run_jobs)
    payload = bounce_event(message_id=a.esp_message_id, recipient=a.email)
    assert _post(payload) == 401
    assert _post(payload, **_auth("postmark:wrong")) == 401
    a.refresh_from_db()
    assert a.status == S.SENT and not EmailSuppression.objects.exists()

    # ANYMAIL_WEBHOOK_SECRET unset (as in this test run): crm.settings refuses every webhook
    from crm import settings as project_settings

    assert project_settings.ANYMAIL_WEBHOOK_SECRET == ""
    settings.ANYMAIL = project_settings.ANYMAIL
    assert _post(payload, **_auth()) == 401
    assert _post(payload, **_auth("refused:")) == 401
    a.refresh_from_db()
    assert a.status == S.SENT
    settings.ANYMAIL = {"WEBHOOK_SECRET": WEBHOOK_SECRET}

    caplog.set_level(logging.INFO, logger="campaigns.esp_tracking")
    stranger = bounce_event(message_id="00000000-0000-0000-0000-000000000000", recipient="x@example.com")
    assert _post(stranger, **_auth()) == 200  # another system's message: not retried forever
    assert "not recorded (yet), kept for a retry: 00000000-0000-0000-0000-000000000000" in caplog.text
    assert inbox.pending() == 1  # until the last retry (test_an_event_for_a_message_never_recorded…)
    assert _metric(campaign) == (1, 1, 0, 0, 0) and not EmailSuppression.objects.exists()


# --- admin ----------------------------------------------------------------------------------------


@pytest.fixture
def staff(client):
    user = get_user_model().objects.create_user("ops", password="x-pw-1234", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def test_the_admin_takes_the_api_key_write_only_and_sends_a_test_through_the_esp(
    transactional_db, postmark, staff, english
):
    org = Organization.objects.create(name="Loja", slug="loja")
    form = {
        "organization": org.pk,
        "provider": "postmark",
        "host": "",
        "port": 587,
        "security": "starttls",
        "username": "",
        "password": "",
        "esp_api_url": postmark.url,
        "sender_name": "Loja",
        "sender_email": "ofertas@loja.example.com.br",
        "messages_per_minute": 300,
    }
    add = "/admin/integrations/emailsettings/add/"
    page = staff.post(add, {**form, "esp_api_key": ""})
    assert page.status_code == 200 and not EmailSettings.objects.exists()
    assert "An email service provider needs an API key." in page.content.decode()
    page = staff.post(add, {**form, "provider": "smtp", "esp_api_key": ""})
    assert "An SMTP server needs a host." in page.content.decode() and not EmailSettings.objects.exists()

    staff.post(add, {**form, "esp_api_key": TOKEN})
    item = EmailSettings.objects.get()
    assert item.get_esp_api_key() == TOKEN and TOKEN not in item.esp_api_key_encrypted
    change = f"/admin/integrations/emailsettings/{item.pk}/change/"
    assert TOKEN.encode() not in staff.get(change).content
    staff.post(change, {**form, "messages_per_minute": 120, "esp_api_key": ""})
    item.refresh_from_db()
    assert (item.messages_per_minute, item.get_esp_api_key()) == (120, TOKEN)  # kept

    url = "/admin/integrations/emailsettings/"
    page = staff.post(url, {"action": "send_test_email", "_selected_action": [item.pk]}, follow=True)
    (sent,) = postmark.messages(to="ofertas@loja.example.com.br")
    assert sent["Subject"] == "Teste de envio — CRM"
    assert f"Postmark sent: {sent['MessageID']}" in page.content.decode()

    item.set_esp_api_key("wrong")
    item.save()
    page = staff.post(url, {"action": "send_test_email", "_selected_action": [item.pk]}, follow=True)
    assert "sender — 401 Postmark error 10: Bad or missing Server API token." in page.content.decode()


# --- the email side of listening (issue 27) ---------------------------------------------------


def _post_applied(path: str, payload: object) -> int:
    auth = _auth()["HTTP_AUTHORIZATION"]
    response = Client().post(
        path, data=json.dumps(payload), content_type="application/json", HTTP_AUTHORIZATION=auth
    )
    applied_from_inbox()
    return response.status_code


def test_a_sendgrid_drop_of_an_unsubscribed_address_opts_out_keeps_the_reason_and_suppresses_nothing(
    em, run_jobs
):
    campaign, people, (a, _) = _sent_campaign(em, 2, run_jobs)
    dropped = {
        "email": a.email,
        "timestamp": 1526923399,
        "event": "dropped",
        "reason": "Unsubscribed Address",
        "sg_event_id": "D1",
        "sg_message_id": "x.filter",
        "anymail_id": a.esp_message_id,
    }
    assert _post_applied("/anymail/sendgrid/tracking/", [dropped]) == 200
    assert _post_applied("/anymail/sendgrid/tracking/", [dropped]) == 200  # retried: applied once
    a.refresh_from_db()
    assert a.status == S.FAILED and a.bounce_message == "SendGrid dropped: Unsubscribed Address"
    customer = Customer.objects.get(pk=people[0].pk)
    assert customer.email_opted_out_at is not None and customer.email_opt_out_source == OptOutSource.PROVIDER
    assert not EmailSuppression.objects.exists()
    assert CampaignMetric.objects.get(campaign=campaign).failed == 1
    assert _statuses(campaign) == {"sent": 1, "failed": 1}


def test_a_brevo_error_event_fails_the_message_with_its_reason(em, run_jobs):
    _, people, (a,) = _sent_campaign(em, 1, run_jobs)
    error = {
        "event": "error",
        "email": a.email,
        "id": 1,
        "date": "2026-12-03 10:00:00",
        "ts_epoch": 1764756000000,
        "message-id": a.esp_message_id,
        "reason": "sender not valid",
    }
    assert _post_applied("/anymail/brevo/tracking/", error) == 200
    a.refresh_from_db()
    assert a.status == S.FAILED and "sender not valid" in a.bounce_message
    assert Customer.objects.get(pk=people[0].pk).email_opted_out_at is None  # not an opt-out
