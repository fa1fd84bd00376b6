"""The ESP tracking intake: only the supported providers are mounted, each authenticated (Mailgun's and
SendGrid's signatures with the organization's own key), and hostile but authenticated input gets a 4xx
with a JSON error, never a 5xx — the classics, and whatever hypothesis makes, over the parser and the
views."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from anymail.signals import AnymailTrackingEvent
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from campaigns import inbox as campaign_inbox
from campaigns.models import Campaign, CampaignMetric, Channel, EmailMessage
from crm import inbox, intake
from crm.models import Customer, InboxEvent, Organization
from integrations.email import tracking
from integrations.models import EmailSettings
from messaging.models import EmailSuppression
from project.sandboxes.esp import bounce_event
from tests.crm.test_intake import HOSTILE, json_values

S = EmailMessage.Status
SECRET = "anymail:hook-s3cret-0123"
MAILGUN_KEY = "key-mailgun-signing-0123456789abcdef"
FUZZ = hsettings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _auth(credentials: str = SECRET) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(credentials.encode()).decode()}


def _post(path: str, body: bytes | str, credentials: str = SECRET, **headers: Any):
    """POST to an intake, then apply what it accepted into the inbox, as a worker would."""
    data = body.encode() if isinstance(body, str) else body
    response = Client().post(
        path, data=data, content_type="application/json", **_auth(credentials), **headers
    )
    applied_from_inbox()
    return response


def applied_from_inbox() -> int:
    """Drain the ESP events the intake stored, here and now (a worker's drain, without Redis)."""
    taken = total = inbox.drain_batch(campaign_inbox.ESP)
    while taken:
        taken = inbox.drain_batch(campaign_inbox.ESP)
        total += taken
    return total


def _refused(response, status: int | None = None) -> dict:
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    if status is not None:
        assert response.status_code == status, response.content[:300]
    data = response.json()
    assert data["ok"] is False and data["error"]
    return data


@pytest.fixture
def esp(transactional_db, settings) -> dict[str, Any]:
    """Two organizations sending through an ESP, each with one sent campaign email."""
    settings.ANYMAIL = {"WEBHOOK_SECRET": SECRET}
    settings.ANYMAIL_WEBHOOK_SECRET = SECRET
    made: dict[str, Any] = {}
    for slug, provider in (
        ("loja", EmailSettings.Provider.MAILGUN),
        ("outra", EmailSettings.Provider.MAILGUN),
    ):
        org = Organization.objects.create(name=slug.title(), slug=slug)
        email = EmailSettings(
            organization=org, provider=provider, sender_name=slug, sender_email=f"x@{slug}.com.br"
        )
        email.set_esp_api_key("api-key")
        email.set_esp_webhook_key(MAILGUN_KEY if slug == "loja" else "key-of-the-other-account")
        email.save()
        customer = Customer.objects.create(
            marketing_consent=True, organization=org, erp_id="C1", name="Ana", email=f"ana@{slug}.com.br"
        )
        campaign = Campaign.objects.create(organization=org, name="bf", channel=Channel.EMAIL, status="sent")
        CampaignMetric.objects.create(campaign=campaign, queued=1, sent=1, delivered=1)
        message = EmailMessage.objects.create(
            campaign=campaign,
            organization=org,
            customer=customer,
            status=S.SENT,
            email=customer.email,
            esp_message_id=f"<20261202.{slug}@mg.example.com.br>",
        )
        made[slug] = {"org": org, "settings": email, "message": message, "campaign": campaign}
    return made


def _mailgun(message_id: str, *, key: str = MAILGUN_KEY, token: str = "t" * 50, **data: Any) -> dict:
    timestamp = str(int(time.time()))
    signature = hmac.new(key.encode(), f"{timestamp}{token}".encode(), hashlib.sha256).hexdigest()
    event = {
        "event": "failed",
        "severity": "permanent",
        "reason": "bounce",
        "recipient": "ana@loja.com.br",
        "timestamp": time.time(),
        "message": {"headers": {"message-id": message_id.strip("<>")}},
        "delivery-status": {"code": 550, "message": "5.1.1 user unknown", "description": ""},
        **data,
    }
    return {
        "signature": {"timestamp": timestamp, "token": token, "signature": signature},
        "event-data": event,
    }


def _url(provider: str, org: Organization | None = None) -> str:
    return f"/anymail/{provider}/tracking/{org.pk}/" if org else f"/anymail/{provider}/tracking/"


# --- which URLs exist -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/anymail/mailgun/tracking/",  # signed per account: only under an organization
        "/anymail/amazon_ses/tracking/",
        "/anymail/mandrill/tracking/",
        "/anymail/sparkpost/tracking/",
        "/anymail/postmark/inbound/",
        "/anymail/mailgun/inbound/",
        "/anymail/unknown/tracking/1/",
    ],
)
def test_only_the_supported_providers_tracking_urls_are_mounted(esp, path):
    _refused(Client().post(path, data="{}", content_type="application/json", **_auth()), 404)


def test_an_organization_url_answers_only_for_the_provider_it_sends_through(esp):
    body = json.dumps(bounce_event(message_id="x", recipient="ana@loja.com.br"))
    _refused(_post(_url("postmark", esp["loja"]["org"]), body), 404)
    _refused(_post("/anymail/mailgun/tracking/999999/", json.dumps(_mailgun("x"))), 404)


# --- authentication --------------------------------------------------------------------------------


def test_mailgun_events_are_applied_only_with_the_organizations_signing_key(esp):
    loja, outra = esp["loja"], esp["outra"]
    message = loja["message"]
    url = _url("mailgun", loja["org"])
    _refused(_post(url, json.dumps(_mailgun(message.esp_message_id, key="wrong"))), 403)
    # the other organization's account key does not sign for this one
    _refused(_post(url, json.dumps(_mailgun(message.esp_message_id, key="key-of-the-other-account"))), 403)
    _refused(_post(url, json.dumps(_mailgun(message.esp_message_id)), credentials="anymail:wrong"), 401)
    message.refresh_from_db()
    assert message.status == S.SENT and not EmailSuppression.objects.exists()

    response = _post(url, json.dumps(_mailgun(message.esp_message_id)))
    assert response.status_code == 200 and response.json() == {"ok": True, "accepted": 1}
    message.refresh_from_db()
    assert (message.status, message.bounce_type) == (S.BOUNCED, "hard")
    assert CampaignMetric.objects.get(campaign=loja["campaign"]).bounced == 1

    # events posted to one organization's URL never touch another organization's messages
    other = outra["message"]
    response = _post(url, json.dumps(_mailgun(other.esp_message_id)))
    assert response.status_code == 200
    kept = InboxEvent.objects.get()  # kept for a retry: no message of this organization has that id
    assert kept.organization_id == loja["org"].pk and kept.not_before is not None
    other.refresh_from_db()
    assert other.status == S.SENT


def test_without_a_stored_signing_key_mailgun_is_refused_with_a_403_not_a_500(esp):
    loja = esp["loja"]
    loja["settings"].set_esp_webhook_key("")
    loja["settings"].save()
    data = _refused(
        _post(_url("mailgun", loja["org"]), json.dumps(_mailgun(loja["message"].esp_message_id))), 403
    )
    assert "signing key" in data["error"]


def test_the_organizations_own_credentials_open_its_url_and_no_other(esp):
    loja, outra = esp["loja"], esp["outra"]
    own = tracking.organization_credentials(SECRET, loja["org"].pk)
    assert own.startswith("anymail:") and own != SECRET and SECRET.split(":")[1] not in own
    body = json.dumps(_mailgun(loja["message"].esp_message_id))
    assert _post(_url("mailgun", loja["org"]), body, credentials=own).status_code == 200
    other_body = json.dumps(_mailgun(outra["message"].esp_message_id, key="key-of-the-other-account"))
    _refused(_post(_url("mailgun", outra["org"]), other_body, credentials=own), 401)
    assert (
        tracking.organization_credentials("", 1) == ""
        and tracking.organization_credentials("nocolon", 1) == ""
    )


def _sendgrid_signed(body: bytes, private_key: ec.EllipticCurvePrivateKey) -> dict[str, str]:
    timestamp = str(int(time.time()))
    signature = private_key.sign(timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    return {
        "HTTP_X_TWILIO_EMAIL_EVENT_WEBHOOK_SIGNATURE": base64.b64encode(signature).decode(),
        "HTTP_X_TWILIO_EMAIL_EVENT_WEBHOOK_TIMESTAMP": timestamp,
    }


def test_sendgrid_signed_events_are_checked_with_the_organizations_verification_key(esp):
    loja = esp["loja"]
    private_key = ec.generate_private_key(ec.SECP256R1())
    public = private_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    email = loja["settings"]
    email.provider = EmailSettings.Provider.SENDGRID
    email.set_esp_webhook_key(base64.b64encode(public).decode())
    email.save()
    message = loja["message"]
    EmailMessage.objects.filter(pk=message.pk).update(esp_message_id="sg-1")
    events = [
        {
            "event": "bounce",
            "type": "bounce",
            "email": message.email,
            "timestamp": int(time.time()),
            "reason": "550 5.1.1 no such user",
            "anymail_id": "sg-1",
            "sg_event_id": "e1",
        }
    ]
    body = json.dumps(events).encode()
    url = _url("sendgrid", loja["org"])
    _refused(_post(url, body), 403)  # unsigned
    forged = _sendgrid_signed(body, ec.generate_private_key(ec.SECP256R1()))
    _refused(_post(url, body, **forged), 403)
    assert _post(url, body, **_sendgrid_signed(body, private_key)).status_code == 200
    assert EmailMessage.objects.get(pk=message.pk).status == S.BOUNCED


def test_the_signing_key_is_encrypted_at_rest(esp):
    with connection.cursor() as cursor:
        cursor.execute("SELECT esp_webhook_key_encrypted FROM integrations_emailsettings ORDER BY id")
        stored = [row[0] for row in cursor.fetchall()]
    assert all(value.startswith("enc1:") and MAILGUN_KEY not in value for value in stored)
    assert EmailSettings.objects.get(organization=esp["loja"]["org"]).get_esp_webhook_key() == MAILGUN_KEY


# --- hostile input --------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "said"), HOSTILE)
@pytest.mark.parametrize("provider", ["postmark", "sendgrid", "brevo", "mailgun"])
def test_the_hostile_classics_get_a_400_with_a_json_error(esp, provider, body, said):
    org = esp["loja"]["org"] if provider == "mailgun" else None
    data = _refused(_post(_url(provider, org), body), 400)
    if said is not None:
        assert said in data["error"]


@pytest.mark.parametrize("provider", ["postmark", "sendgrid", "brevo", "mailgun"])
def test_a_body_over_the_limit_gets_a_413(esp, provider):
    org = esp["loja"]["org"] if provider == "mailgun" else None
    _refused(_post(_url(provider, org), b'{"a": "' + b"x" * intake.MAX_BYTES + b'"}'), 413)


@pytest.mark.parametrize(
    ("provider", "payload", "said"),
    [
        ("postmark", [], "must be a JSON object"),
        ("postmark", {"MessageID": "x"}, "RecordType"),
        ("postmark", {"RecordType": "Bounce", "BouncedAt": 5}, "not a Postmark event"),
        ("sendgrid", {"event": "bounce"}, "JSON array"),
        ("sendgrid", [1], "must be a JSON object"),
        ("sendgrid", [{"event": "bounce"}] * (tracking.MAX_EVENTS + 1), "more than"),
        ("sendgrid", [{"event": "dropped", "reason": 7}], "not a SendGrid event"),
        ("brevo", {"items": [], "event": "x"}, "inbound"),
        ("brevo", {"event": 3}, "non-empty string"),
        ("mailgun", {"signature": "x"}, "signature"),
    ],
)
def test_payloads_not_of_the_providers_shape_get_a_400(esp, provider, payload, said):
    org = esp["loja"]["org"] if provider == "mailgun" else None
    data = _refused(_post(_url(provider, org), json.dumps(payload)), 400)
    assert said in data["error"]


def test_a_signed_mailgun_event_anymail_cannot_read_gets_a_400(esp):
    org = esp["loja"]["org"]
    body = _mailgun("x", timestamp="not a number")
    _refused(_post(_url("mailgun", org), json.dumps(body)), 400)


def test_a_head_probe_answers_200(esp):
    assert Client().head(_url("postmark")).status_code == 200


# hypothesis: the parser never raises anything but Malformed, and its events carry text as text


@hsettings(max_examples=300, deadline=None)
@given(provider=st.sampled_from(tracking.PROVIDERS), value=json_values)
def test_the_parser_returns_events_or_refuses_never_an_unexpected_error(provider, value):
    _parsed_or_refused(provider, value)


def _parsed_or_refused(provider: str, value: Any) -> None:
    """tracking.parse returns events whose text fields are text, or raises Malformed; nothing else."""
    try:
        events = tracking.parse(provider, value)
    except tracking.Malformed as exc:
        assert str(exc)
        return
    assert len(events) == (len(value) if provider == "sendgrid" else 1)
    for event in events:
        assert isinstance(event, AnymailTrackingEvent) and isinstance(event.event_type, str)
        for field in ("message_id", "description", "mta_response", "recipient", "event_id"):
            assert getattr(event, field) is None or isinstance(getattr(event, field), str)


_inner = st.dictionaries(
    st.sampled_from(
        [
            "MessageID",
            "Type",
            "Description",
            "Details",
            "BouncedAt",
            "Email",
            "RecordType",
            "event",
            "timestamp",
            "reason",
            "type",
            "message-id",
            "message",
            "headers",
            "delivery-status",
            "severity",
            "anymail_id",
            "response",
            "date",
            "ts",
            "id",
            "tag",
        ]
    ),
    json_values,
    max_size=8,
)
shaped = {
    "postmark": st.builds(
        lambda d, t: {**d, "RecordType": t},
        _inner,
        st.sampled_from(["Bounce", "Delivery", "Open", "Click", "SpamComplaint", "X"]),
    ),
    "sendgrid": st.lists(
        st.builds(
            lambda d, e: {**d, "event": e},
            _inner,
            st.sampled_from(["bounce", "dropped", "open", "click", "spamreport", "x"]),
        ),
        max_size=3,
    ),
    "brevo": st.builds(
        lambda d, e: {**d, "event": e},
        _inner,
        st.sampled_from(["hard_bounce", "soft_bounce", "blocked", "spam", "opened", "click", "x"]),
    ),
}


@hsettings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_parser_takes_any_payload_of_the_providers_outer_shape_or_refuses_it(data):
    provider = data.draw(st.sampled_from(sorted(shaped)))
    _parsed_or_refused(provider, data.draw(shaped[provider]))


@FUZZ
@given(provider=st.sampled_from(["postmark", "sendgrid", "brevo"]), value=json_values)
def test_every_intake_answers_any_authenticated_json_with_a_4xx_or_applies_it(esp, provider, value):
    response = _post(_url(provider), json.dumps(value))
    assert response.status_code < 500
    if response.status_code != 200:
        _refused(response)


@FUZZ
@given(data=st.data())
def test_every_intake_answers_payloads_of_the_providers_shape_with_a_4xx_or_applies_them(esp, data):
    provider = data.draw(st.sampled_from(sorted(shaped)))
    payload = data.draw(shaped[provider])
    response = _post(_url(provider), json.dumps(payload))
    assert response.status_code < 500
    if response.status_code != 200:
        _refused(response)


@FUZZ
@given(
    event_data=st.dictionaries(
        st.sampled_from(
            [
                "event",
                "severity",
                "reason",
                "timestamp",
                "message",
                "delivery-status",
                "recipient",
                "tags",
                "user-variables",
            ]
        ),
        json_values,
        max_size=6,
    ),
    event=st.sampled_from(["failed", "delivered", "opened", "clicked", "complained", "x"]),
)
def test_signed_mailgun_payloads_of_any_content_get_a_4xx_or_are_applied(esp, event_data, event):
    body = _mailgun("x")
    body["event-data"] = {**event_data, "event": event}
    response = _post(_url("mailgun", esp["loja"]["org"]), json.dumps(body))
    assert response.status_code < 500
    if response.status_code != 200:
        _refused(response)


# --- admin ------------------------------------------------------------------------------------------


def test_the_admin_shows_the_url_to_paste_and_takes_the_signing_key_write_only(
    esp, client, english, settings
):
    settings.PUBLIC_URL = "https://crm.example.com.br"
    user = get_user_model().objects.create_user("ops", password="x-pw-1234", is_staff=True, is_superuser=True)
    client.force_login(user)
    email = esp["loja"]["settings"]
    page = client.get(f"/admin/integrations/emailsettings/{email.pk}/change/").content.decode()
    own = tracking.organization_credentials(SECRET, esp["loja"]["org"].pk)
    assert f"https://{own}@crm.example.com.br/anymail/mailgun/tracking/{esp['loja']['org'].pk}/" in page
    assert "HTTP webhook signing key" in page and "a signing key is stored" in page
    assert MAILGUN_KEY not in page and SECRET not in page  # neither the key nor the deployment's secret
    form = {
        "organization": esp["loja"]["org"].pk,
        "provider": "mailgun",
        "sender_name": "Loja",
        "sender_email": "x@loja.com.br",
        "messages_per_minute": 300,
        "port": 587,
        "security": "starttls",
        "esp_webhook_key": "key-rotated-0123",
    }
    response = client.post(f"/admin/integrations/emailsettings/{email.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    email.refresh_from_db()
    assert email.get_esp_webhook_key() == "key-rotated-0123"
    form["esp_webhook_key"] = ""  # empty: kept
    assert client.post(f"/admin/integrations/emailsettings/{email.pk}/change/", form).status_code == 302
    email.refresh_from_db()
    assert email.get_esp_webhook_key() == "key-rotated-0123"
    form.update(provider="sendgrid", esp_webhook_key="not a key")
    page = client.post(f"/admin/integrations/emailsettings/{email.pk}/change/", form).content.decode()
    assert "not the verification key SendGrid shows" in page
