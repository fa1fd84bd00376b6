"""Meta status webhooks: signature, parsing, monotonic statuses, metrics, opt-outs, end to end over HTTP."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from campaigns import lifecycle, recovery, statuses
from campaigns.models import OUTCOME_UNKNOWN, Campaign, CampaignMetric, WhatsappMessage
from crm import inbox, queues
from crm.models import Customer, OptOutSource, Organization
from integrations.models import WhatsappNumber, WhatsappPrice
from integrations.whatsapp import pricing, webhooks
from integrations.whatsapp.webhooks import PreferenceEvent, StatusEvent
from tests.conftest import wait_for
from tests.crm.test_prometheus import scrape, value

S = WhatsappMessage.Status
SECRET = "meta-app-secret-for-tests"
URL = "/webhooks/whatsapp/"
T0 = 1_731_700_000  # Unix seconds, as Meta sends them


def _sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _status(wamid: str, status: str, ts: int = T0, **extra: Any) -> dict[str, Any]:
    return {"id": wamid, "status": status, "timestamp": str(ts), "recipient_id": "5511999990001", **extra}


def _payload(*, statuses_: list[Any] | None = None, preferences: list[dict] | None = None) -> dict:
    changes: list[dict[str, Any]] = []
    value: dict[str, Any]
    if statuses_ is not None:
        value = {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "5511940000000", "phone_number_id": "109876543210"},
            "statuses": statuses_,
        }
        changes.append({"field": "messages", "value": value})
    if preferences is not None:
        value = {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "5511940000000", "phone_number_id": "109876543210"},
            "contacts": [{"wa_id": p["wa_id"], "profile": {"name": "Ana"}} for p in preferences],
            "user_preferences": preferences,
        }
        changes.append({"field": "user_preferences", "value": value})
    return {"object": "whatsapp_business_account", "entry": [{"id": "102290129340398", "changes": changes}]}


def _events(*items: tuple[str, str, int]) -> list[StatusEvent]:
    return webhooks.parse(_payload(statuses_=[_status(w, s, ts) for w, s, ts in items])).statuses


def _metric(campaign: Campaign) -> tuple[int, int, int, int]:
    m = CampaignMetric.objects.get(campaign=campaign)
    return (m.sent, m.delivered, m.read, m.failed)


def _counts(campaign: Campaign) -> dict[str, int]:
    from campaigns.selectors import campaign_counts

    return {k: v for k, v in campaign_counts(campaign_id=campaign.pk).items() if v}


@pytest.fixture
def outbox(world):
    """A sending campaign and a factory of its messages, SENT (accepted by Meta) unless told."""
    org = world["org"]
    campaign = Campaign.objects.create(organization=org, name="Dia das Mães", status=Campaign.Status.SENDING)
    metric = CampaignMetric.objects.create(campaign=campaign)

    def make(n: int, status: str = S.SENT) -> list[WhatsappMessage]:
        start = Customer.objects.count()
        people = Customer.objects.bulk_create(
            [
                Customer(
                    marketing_consent=True,
                    organization=org,
                    erp_id=f"W{i}",
                    name=f"Cliente {i}",
                    phone=f"+55119{70000000 + i}",
                )
                for i in range(start, start + n)
            ]
        )
        accepted = status not in (S.QUEUED, S.SENDING)
        messages = WhatsappMessage.objects.bulk_create(
            [
                WhatsappMessage(
                    campaign=campaign,
                    organization=org,
                    customer=c,
                    status=status,
                    phone=c.phone,
                    wa_id=c.phone.lstrip("+") if accepted else "",
                    wamid=f"wamid.TEST{c.pk}" if accepted else None,
                    sent_at=timezone.now() - timedelta(minutes=5) if accepted else None,
                )
                for c in people
            ]
        )
        if status == S.SENT:
            CampaignMetric.objects.filter(pk=metric.pk).update(queued=n, sent=n)
        return messages

    return {"campaign": campaign, "make": make}


# -- signature ----------------------------------------------------------------------------------


def test_a_body_signed_with_the_app_secret_verifies():
    body = b'{"object":"whatsapp_business_account","entry":[]}'
    assert webhooks.verify_signature(body, _sign(body), SECRET)
    assert webhooks.verify_signature(body, _sign(body).upper().replace("SHA256=", "sha256="), SECRET)


@pytest.mark.parametrize(
    ("header", "secret"),
    [
        (_sign(b"{}", "another-secret"), SECRET),  # signed with someone else's secret
        (_sign(b'{"tampered": true}'), SECRET),  # the signature of another body
        (None, SECRET),
        ("", SECRET),
        ("sha1=" + hashlib.sha1(b"{}").hexdigest(), SECRET),  # noqa: S324 - the legacy header shape
        ("sha256=not-hex", SECRET),
        ("sha256=" + "é" * 64, SECRET),
        (_sign(b"{}", ""), ""),  # no app secret configured: nothing verifies
    ],
)
def test_a_wrong_missing_or_malformed_signature_does_not_verify(header, secret):
    assert webhooks.verify_signature(b"{}", header, secret) is False


# -- parsing ------------------------------------------------------------------------------------


def test_parse_reads_statuses_and_preferences_from_a_meta_payload():
    payload = _payload(
        statuses_=[
            _status(
                "wamid.HBgNNTUxMTk5OTk5MDAwMRUCABEYEjQ",
                "delivered",
                biz_opaque_callback_data="m:42",
                conversation={"id": "c0ffee", "origin": {"type": "marketing"}},
                pricing={
                    "billable": True,
                    "pricing_model": "PMP",
                    "category": "marketing",
                    "type": "regular",
                },
            ),
            _status(
                "wamid.B",
                "failed",
                T0 + 1,
                errors=[{"code": 131049, "title": "This message was not delivered", "href": "https://x"}],
            ),
            _status("wamid.C", "deleted"),  # documented, not tracked: skipped
        ],
        preferences=[
            {
                "wa_id": "5511999990001",
                "detail": "User requested to stop marketing messages",
                "category": "marketing_messages",
                "value": "stop",
                "timestamp": T0 + 2,
            }
        ],
    )
    payload["entry"][0]["changes"][0]["value"]["messages"] = [
        {
            "from": "5511999990001",
            "id": "wamid.IN1",
            "timestamp": str(T0),
            "type": "text",
            "text": {"body": "oi"},
        }
    ]
    batch = webhooks.parse(payload)
    delivered, failed = batch.statuses
    assert delivered == StatusEvent(
        wamid="wamid.HBgNNTUxMTk5OTk5MDAwMRUCABEYEjQ",
        status="delivered",
        timestamp=datetime.fromtimestamp(T0, tz=UTC),
        recipient_id="5511999990001",
        biz_opaque_callback_data="m:42",
        pricing_category="marketing",
        billable=True,
    )
    assert delivered.timestamp.utcoffset() == timedelta(0)
    assert (failed.status, failed.error_code, failed.error_title) == (
        "failed",
        131049,
        "This message was not delivered",
    )
    assert (failed.billable, failed.pricing_category) == (None, "")
    assert batch.preferences == [
        PreferenceEvent(
            wa_id="5511999990001",
            value="stop",
            timestamp=datetime.fromtimestamp(T0 + 2, tz=UTC),
            phone_number_id="109876543210",
        )
    ]
    assert batch.ignored == 1  # the "deleted" status
    assert [m.kind for m in batch.messages] == ["text"]  # the inbound text is taken in


def test_parse_ignores_other_fields_and_categories():
    payload = {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": "1",
                "changes": [
                    {"field": "message_template_status_update", "value": {"event": "APPROVED"}},
                    {
                        "field": "user_preferences",
                        "value": {
                            "user_preferences": [
                                {"wa_id": "5511999990001", "category": "other", "value": "x", "timestamp": T0}
                            ]
                        },
                    },
                ],
            }
        ],
    }
    batch = webhooks.parse(payload)
    assert (batch.statuses, batch.preferences, batch.ignored) == ([], [], 2)


def _with_status(**fields: Any) -> dict:
    status = {k: v for k, v in {**_status("wamid.A", "sent"), **fields}.items() if v is not None}
    return _payload(statuses_=[status])


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ([], "JSON object"),
        ({"object": "page", "entry": []}, "unexpected object 'page'"),
        ({"object": "whatsapp_business_account"}, "entry must be a list"),
        ({"object": "whatsapp_business_account", "entry": {}}, "entry must be a list"),
        ({"object": "whatsapp_business_account", "entry": ["x"]}, r"entry\[0\] must be an object"),
        ({"object": "whatsapp_business_account", "entry": [{"changes": {}}]}, "changes must be a list"),
        ({"object": "whatsapp_business_account", "entry": [{"changes": [{"value": 1}]}]}, "value must be"),
        (
            {"object": "whatsapp_business_account", "entry": [{"changes": [{"value": {"statuses": {}}}]}]},
            "statuses must be a list",
        ),
        (_payload(statuses_=["sent"]), r"statuses\[0\] must be an object"),
        (_with_status(id=None), "has no id"),
        (_with_status(status=None), "has no status"),
        (_with_status(status="bounced"), "unknown status 'bounced'"),
        (_with_status(timestamp="yesterday"), "timestamp must be Unix seconds"),
        (_with_status(timestamp=True), "timestamp must be Unix seconds"),
        (_with_status(timestamp=None), "timestamp must be Unix seconds"),
        (_with_status(timestamp="99999999999999"), "timestamp must be Unix seconds"),
        (
            _payload(preferences=[{"wa_id": "55", "category": "marketing_messages", "value": "pause"}]),
            "unknown preference value 'pause'",
        ),
        (
            _payload(preferences=[{"wa_id": "+55 11", "category": "marketing_messages", "value": "stop"}]),
            "wa_id must be digits",
        ),
    ],
)
def test_a_malformed_payload_raises_value_error_saying_why(payload, reason):
    with pytest.raises(ValueError, match=reason):
        webhooks.parse(payload)


# -- the view -----------------------------------------------------------------------------------


def test_the_verification_handshake_echoes_the_challenge_only_for_the_right_token(client, settings):
    settings.WHATSAPP_VERIFY_TOKEN = "verify-me"
    query = {"hub.mode": "subscribe", "hub.verify_token": "verify-me", "hub.challenge": "1158201444"}
    response = client.get(URL, query)
    assert response.status_code == 200
    assert response.content == b"1158201444" and response["Content-Type"].startswith("text/plain")
    assert client.get(URL, {**query, "hub.verify_token": "guess"}).status_code == 403
    assert client.get(URL, {**query, "hub.mode": "unsubscribe"}).status_code == 403
    assert client.get(URL, {k: v for k, v in query.items() if k != "hub.verify_token"}).status_code == 403
    settings.WHATSAPP_VERIFY_TOKEN = ""  # not configured: nobody subscribes, not even with ""
    assert client.get(URL, {**query, "hub.verify_token": ""}).status_code == 403
    refused = client.put(URL)
    assert refused.status_code == 405 and refused.json() == {
        "ok": False,
        "error": "method PUT not allowed here; use GET, POST",
    }


def _post(client, body: bytes, signature: str | None = None):
    headers = {"HTTP_X_HUB_SIGNATURE_256": signature if signature is not None else _sign(body)}
    return client.post(URL, data=body, content_type="application/json", **headers)


def test_a_post_without_a_valid_signature_is_refused_and_changes_nothing(client, settings, outbox):
    settings.WHATSAPP_APP_SECRET = SECRET
    message = outbox["make"](1)[0]
    body = json.dumps(_payload(statuses_=[_status(message.wamid, "read")])).encode()
    assert _post(client, body, signature=_sign(body, "wrong-secret")).status_code == 403
    assert _post(client, body, signature="").status_code == 403
    settings.WHATSAPP_APP_SECRET = ""  # no secret configured: even a body "signed" with "" is refused
    assert _post(client, body, signature=_sign(body, "")).status_code == 403
    message.refresh_from_db()
    assert message.status == S.SENT and message.read_at is None
    assert _metric(outbox["campaign"]) == (1, 0, 0, 0)


def test_a_malformed_post_is_a_400_with_a_logged_reason_never_a_500(client, settings, db, caplog):
    settings.WHATSAPP_APP_SECRET = SECRET
    caplog.set_level(logging.WARNING, logger="campaigns.webhook_views")
    response = _post(client, b'{"object": "whatsapp_business_account", "entry": [')
    assert response.status_code == 400 and "not JSON" in response.json()["error"]
    response = _post(client, b"\xff\xfe not utf-8")
    assert response.status_code == 400
    response = _post(client, json.dumps(_with_status(status="bounced")).encode())
    assert response.status_code == 400 and "unknown status" in response.json()["error"]
    assert "refused payload: entry[0].changes[0].value.statuses[0]: unknown status 'bounced'" in caplog.text


def test_a_signed_post_is_stored_answered_200_and_applied_by_the_workers(
    client, settings, outbox, drain_inbox
):
    settings.WHATSAPP_APP_SECRET = SECRET
    message = outbox["make"](1)[0]
    body = json.dumps(
        _payload(statuses_=[_status(message.wamid, "delivered"), _status("wamid.SOMEONE-ELSE", "read")])
    ).encode()
    response = _post(client, body)
    assert response.status_code == 200
    assert response.json() == {"ok": True, "accepted": 2, "skipped": 0}
    message.refresh_from_db()
    assert message.status == S.SENT  # stored, not applied yet: the request only persists it
    assert inbox.pending("whatsapp") == 1
    drain_inbox()
    assert inbox.pending("whatsapp") == 0
    message.refresh_from_db()
    assert message.status == S.DELIVERED
    assert message.delivered_at == datetime.fromtimestamp(T0, tz=UTC)


# -- ordering, duplicates, metrics --------------------------------------------------------------


def test_read_before_delivered_counts_both_once_and_the_late_delivered_changes_nothing(outbox):
    message = outbox["make"](1)[0]
    campaign = outbox["campaign"]
    result = statuses.statuses_apply(events=_events((message.wamid, "read", T0 + 5)))
    assert result["applied"] == 1
    message.refresh_from_db()
    assert message.status == S.READ
    assert message.read_at == message.delivered_at == datetime.fromtimestamp(T0 + 5, tz=UTC)
    assert _metric(campaign) == (1, 1, 1, 0)

    late = statuses.statuses_apply(events=_events((message.wamid, "delivered", T0 + 2)))
    assert (late["applied"], late["ignored"]) == (0, 1)
    message.refresh_from_db()
    assert message.status == S.READ and message.delivered_at == datetime.fromtimestamp(T0 + 5, tz=UTC)
    assert _metric(campaign) == (1, 1, 1, 0)


def test_a_failed_status_after_delivered_is_ignored(outbox):
    message = outbox["make"](1)[0]
    statuses.statuses_apply(events=_events((message.wamid, "delivered", T0)))
    result = statuses.statuses_apply(events=_events((message.wamid, "failed", T0 + 1)))
    assert result["ignored"] == 1
    message.refresh_from_db()
    assert (message.status, message.failed_at, message.error_code) == (S.DELIVERED, None, None)
    assert _metric(outbox["campaign"]) == (1, 1, 0, 0)


def test_a_failed_status_after_sent_fails_the_message_and_it_stays_counted_as_sent(outbox):
    message = outbox["make"](1)[0]
    event = _with_status(
        id=message.wamid, status="failed", errors=[{"code": 131026, "title": "Message undeliverable"}]
    )
    statuses.statuses_apply(events=webhooks.parse(event).statuses)
    message.refresh_from_db()
    assert (message.status, message.error_code, message.error_reason) == (
        S.FAILED,
        131026,
        "Message undeliverable",
    )
    assert message.failed_at == datetime.fromtimestamp(T0, tz=UTC) and message.sent_at is not None
    assert _metric(outbox["campaign"]) == (1, 0, 0, 1)
    # a failed message stays failed: a straggling "delivered" does not revive it
    statuses.statuses_apply(events=_events((message.wamid, "delivered", T0 + 1)))
    assert WhatsappMessage.objects.get(pk=message.pk).status == S.FAILED
    assert _metric(outbox["campaign"]) == (1, 0, 0, 1)


def test_duplicate_events_are_counted_once(outbox):
    first, second = outbox["make"](2)
    batch = _events(
        (first.wamid, "delivered", T0),
        (first.wamid, "delivered", T0),
        (second.wamid, "read", T0 + 1),
        (second.wamid, "read", T0 + 1),
    )
    assert statuses.statuses_apply(events=batch) == {"applied": 2, "ignored": 2, "unknown": 0, "settled": 0}
    # Meta retrying the whole POST changes nothing either
    assert statuses.statuses_apply(events=batch) == {"applied": 0, "ignored": 4, "unknown": 0, "settled": 0}
    assert _metric(outbox["campaign"]) == (2, 2, 1, 0)
    assert _counts(outbox["campaign"]) == {"delivered": 1, "read": 1}


def test_unknown_messages_are_counted_and_nothing_is_written(outbox):
    outbox["make"](1)
    with CaptureQueriesContext(connection) as queries:
        result = statuses.statuses_apply(events=_events(("wamid.NOT-OURS", "read", T0)))
    assert result == {"applied": 0, "ignored": 0, "unknown": 1, "settled": 0}
    assert not [q for q in queries if q["sql"].startswith("UPDATE")]
    assert _metric(outbox["campaign"]) == (1, 0, 0, 0)


def test_a_batch_is_applied_in_a_constant_number_of_queries(outbox):
    messages = outbox["make"](40)
    events = [(m.wamid, s, T0 + i) for m in messages for i, s in enumerate(("sent", "delivered", "read"))]
    with CaptureQueriesContext(connection) as queries:
        result = statuses.statuses_apply(events=_events(*events))
    assert result["applied"] == 80 and result["ignored"] == 40  # "sent" was already known
    # savepoint, SELECT ... FOR UPDATE, one bulk UPDATE, one metric UPDATE, release, completion check;
    # the batch that completes the campaign adds its savepoint, the completion and the control group's
    # send-time stamp (campaigns.lift), and its release
    assert len(queries) <= 11, [q["sql"][:80] for q in queries]
    metric_updates = [q for q in queries if 'UPDATE "campaigns_campaignmetric"' in q["sql"]]
    assert len(metric_updates) == 1
    assert _metric(outbox["campaign"]) == (40, 40, 40, 0)


# -- messages whose send outcome we never recorded ----------------------------------------------


def test_a_message_stuck_in_sending_is_settled_by_a_webhook_carrying_its_callback_data(
    client, settings, outbox, drain_inbox, caplog
):
    settings.WHATSAPP_APP_SECRET = SECRET
    caplog.set_level(logging.INFO, logger="campaigns.statuses")
    campaign = outbox["campaign"]
    message = outbox["make"](1, status=S.QUEUED)[0]
    # Claimed like the send job does, and the worker died after Meta accepted the message.
    WhatsappMessage.objects.filter(pk=message.pk).update(
        status=S.SENDING, attempts=1, sending_at=timezone.now() - timedelta(seconds=30)
    )
    callback = {"biz_opaque_callback_data": f"m:{message.pk}"}
    sent = _status("wamid.FROM-META", "sent", T0, **callback)
    delivered = _status("wamid.FROM-META", "delivered", T0 + 3, **callback)
    response = _post(client, json.dumps(_payload(statuses_=[sent])).encode())
    assert response.status_code == 200
    drain_inbox()
    assert "status webhooks settled 1 in-flight message(s)" in caplog.text
    message.refresh_from_db()
    assert (message.status, message.wamid, message.wa_id) == (S.SENT, "wamid.FROM-META", "5511999990001")
    assert message.sent_at == datetime.fromtimestamp(T0, tz=UTC)
    assert _metric(campaign) == (1, 0, 0, 0)
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT  # nothing in flight now
    assert _post(client, json.dumps(_payload(statuses_=[delivered])).encode()).status_code == 200
    drain_inbox()
    message.refresh_from_db()
    assert message.status == S.DELIVERED
    assert _metric(campaign) == (1, 1, 0, 0)


PRICING = {"billable": True, "pricing_model": "PMP", "category": "marketing", "type": "regular"}


def _unknown(outbox, n: int) -> list[WhatsappMessage]:
    """n messages whose worker died mid-send, settled by the reconciliation as outcome unknown."""
    messages = outbox["make"](n, status=S.QUEUED)
    WhatsappMessage.objects.filter(pk__in=[m.pk for m in messages]).update(
        status=S.SENDING, attempts=1, sending_at=timezone.now() - timedelta(hours=1)
    )
    CampaignMetric.objects.filter(campaign=outbox["campaign"]).update(queued=F("queued") + n)
    assert recovery.reconcile_in_flight(older_than_seconds=60) == n
    return messages


def _unknown_count(campaign: Campaign) -> int:
    return CampaignMetric.objects.get(campaign=campaign).unknown


def test_reconciliation_settles_in_flight_messages_as_unknown_and_the_campaign_completes(client, outbox):
    campaign = outbox["campaign"]
    message = _unknown(outbox, 1)[0]
    message.refresh_from_db()
    assert (message.status, message.failed_at, message.wamid) == (S.UNKNOWN, None, None)
    assert message.error_reason == OUTCOME_UNKNOWN  # says why, for the admin
    assert _metric(campaign) == (0, 0, 0, 0) and _unknown_count(campaign) == 1
    assert _counts(campaign) == {"unknown": 1}
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT
    # the operator sees it: campaign_status (--json key "unknown", and the human line) and /metrics
    out = StringIO()
    call_command("campaign_status", str(campaign.pk), "--json", stdout=out)
    assert json.loads(out.getvalue())["counts"]["unknown"] == 1
    out = StringIO()
    call_command("campaign_status", str(campaign.pk), stdout=out)
    assert "unknown 1" in out.getvalue() or "desconhecido 1" in out.getvalue()
    samples = scrape(client)
    assert value(samples, "crm_messages", channel="whatsapp", status="unknown") == 1
    assert value(samples, "crm_messages", channel="whatsapp", status="failed") == 0
    # "retry failed" never sends it again: Meta may have it
    assert lifecycle.campaign_retry_failed(campaign=Campaign.objects.get(pk=campaign.pk)) == 0
    assert WhatsappMessage.objects.get(pk=message.pk).status == S.UNKNOWN


def test_an_unknown_message_becomes_read_leaves_the_unknown_count_and_costs_what_meta_says(
    client, settings, outbox, drain_inbox
):
    settings.WHATSAPP_APP_SECRET = SECRET
    WhatsappPrice.objects.create(category="marketing", country="BR", price="0.0625")
    WhatsappPrice.objects.create(category="marketing", country="*", price="0.07")
    campaign = outbox["campaign"]
    message = _unknown(outbox, 1)[0]
    callback = {"biz_opaque_callback_data": f"m:{message.pk}"}
    # Meta's order: sent (by our callback data: we never learnt the wamid), delivered, read (by wamid)
    sent = _status("wamid.LATE", "sent", T0, pricing=PRICING, **callback)
    delivered = _status("wamid.LATE", "delivered", T0 + 2, pricing=PRICING)
    read = _status("wamid.LATE", "read", T0 + 9)
    response = _post(client, json.dumps(_payload(statuses_=[sent])).encode())
    assert response.status_code == 200 and response.json()["accepted"] == 1
    drain_inbox()
    assert _metric(campaign) == (1, 0, 0, 0) and _unknown_count(campaign) == 0
    for payload in ([delivered], [read], [sent, delivered, read]):  # the last: Meta retrying them all
        assert _post(client, json.dumps(_payload(statuses_=payload)).encode()).status_code == 200
        drain_inbox()
    message.refresh_from_db()
    assert (message.status, message.wamid, message.error_reason, message.failed_at) == (
        S.READ,
        "wamid.LATE",
        "",
        None,
    )
    assert message.sent_at == datetime.fromtimestamp(T0, tz=UTC)
    assert message.read_at == datetime.fromtimestamp(T0 + 9, tz=UTC)
    assert _metric(campaign) == (1, 1, 1, 0) and _unknown_count(campaign) == 0
    assert message.cost == Decimal("0.0625")  # a Brazilian number, marketing: once
    assert CampaignMetric.objects.get(campaign=campaign).cost == Decimal("0.0625")


def test_a_late_failed_status_moves_an_unknown_message_to_failed_once_and_costs_nothing(outbox):
    WhatsappPrice.objects.create(category="marketing", country="*", price="0.07")
    campaign = outbox["campaign"]
    message = _unknown(outbox, 1)[0]
    failed = _status(
        "wamid.F",
        "failed",
        T0,
        biz_opaque_callback_data=f"m:{message.pk}",
        errors=[{"code": 131049, "title": "healthy ecosystem"}],
        pricing={**PRICING, "billable": False},
    )
    for _ in range(2):
        statuses.statuses_apply(events=webhooks.parse(_payload(statuses_=[failed])).statuses)
    message.refresh_from_db()
    assert (message.status, message.error_code, message.cost) == (S.FAILED, 131049, Decimal("0"))
    assert _metric(campaign) == (0, 0, 0, 1) and _unknown_count(campaign) == 0
    assert CampaignMetric.objects.get(campaign=campaign).cost == 0


def test_meta_pricing_categories_map_to_the_rate_card():
    assert [pricing.rate_category(c) for c in ("marketing", "MARKETING", "marketing_lite", "utility")] == [
        "marketing",
        "marketing",
        "marketing",
        "utility",
    ]
    assert pricing.rate_category("authentication_international") == "authentication"
    assert [pricing.rate_category(c) for c in ("referral_conversion", "", "_", "free_entry_point")] == [
        None,
        None,
        None,
        None,
    ]


_late = st.tuples(
    st.integers(min_value=0, max_value=3),  # which message
    st.sampled_from(["sent", "delivered", "read", "failed"]),
    st.integers(min_value=0, max_value=5),  # seconds after T0
    st.booleans(),  # by callback data (else by the wamid Meta gave it)
    st.sampled_from([None, "marketing", "utility", "marketing_lite", "referral_conversion"]),
)


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(_late, max_size=6), min_size=1, max_size=4))
def test_late_statuses_in_any_order_and_repetition_keep_the_counters_equal_to_the_messages(outbox, batches):
    WhatsappPrice.objects.get_or_create(category="marketing", country="*", defaults={"price": "0.07"})
    WhatsappPrice.objects.get_or_create(category="utility", country="BR", defaults={"price": "0.008"})
    campaign = Campaign.objects.create(
        organization=outbox["campaign"].organization, name="x", status=Campaign.Status.SENDING
    )
    CampaignMetric.objects.create(campaign=campaign)
    messages = _unknown({"campaign": campaign, "make": _maker(campaign)}, 4)
    for batch in batches:
        events = []
        for which, status, after, by_callback, category in batch:
            m = messages[which]
            extra: dict[str, Any] = {}
            if by_callback:
                extra["biz_opaque_callback_data"] = f"m:{m.pk}"
            if category:
                extra["pricing"] = {
                    **PRICING,
                    "category": category,
                    "billable": category != "referral_conversion",
                }
            events.append(_status(f"wamid.H{m.pk}", status, T0 + after, **extra))
        statuses.statuses_apply(events=webhooks.parse(_payload(statuses_=events)).statuses)
    rows = list(WhatsappMessage.objects.filter(campaign=campaign))
    metric = CampaignMetric.objects.get(campaign=campaign)
    accepted = (S.SENT, S.DELIVERED, S.READ)
    assert metric.unknown == sum(r.status == S.UNKNOWN for r in rows)
    # a message sent and then reported failed stays counted as sent (as for any message)
    assert metric.sent == sum(
        r.status in accepted or (r.status == S.FAILED and bool(r.sent_at)) for r in rows
    )
    assert metric.delivered == sum(r.status in (S.DELIVERED, S.READ) for r in rows)
    assert metric.read == sum(r.status == S.READ for r in rows)
    assert metric.failed == sum(r.status == S.FAILED for r in rows)
    assert metric.cost == sum(r.cost for r in rows)
    assert all(r.cost in (Decimal("0"), Decimal("0.07"), Decimal("0.008")) for r in rows)
    assert all(r.cost == 0 for r in rows if r.status == S.UNKNOWN)
    # A message nothing named by its callback data was never adopted: its wamid is unknown to us.
    named = {messages[w].pk for b in batches for w, _, _, by_callback, _ in b if by_callback}
    assert all(r.status == S.UNKNOWN for r in rows if r.pk not in named)


def _maker(campaign: Campaign):
    org = campaign.organization

    def make(n: int, status: str = S.QUEUED) -> list[WhatsappMessage]:
        start = Customer.objects.count()
        people = Customer.objects.bulk_create(
            [
                Customer(
                    marketing_consent=True,
                    organization=org,
                    erp_id=f"H{i}",
                    name=f"Cliente {i}",
                    phone=f"+55119{60000000 + i}",
                )
                for i in range(start, start + n)
            ]
        )
        return WhatsappMessage.objects.bulk_create(
            [
                WhatsappMessage(campaign=campaign, organization=org, customer=c, status=status, phone=c.phone)
                for c in people
            ]
        )

    return make


def test_callback_data_never_adopts_a_message_that_has_its_own_wamid_or_a_final_status(outbox):
    accepted = outbox["make"](1)[0]
    skipped = outbox["make"](1, status=S.QUEUED)[0]
    WhatsappMessage.objects.filter(pk=skipped.pk).update(status=S.SKIPPED, error_reason="opted out")
    events = [
        _status("wamid.OTHER", "read", biz_opaque_callback_data=f"m:{accepted.pk}"),
        _status("wamid.X", "delivered", biz_opaque_callback_data=f"m:{skipped.pk}"),
        _status("wamid.Y", "delivered", biz_opaque_callback_data="m:999999999"),
        _status("wamid.Z", "delivered", biz_opaque_callback_data="campaign-7"),
    ]
    result = statuses.statuses_apply(events=webhooks.parse(_payload(statuses_=events)).statuses)
    assert result == {"applied": 0, "ignored": 1, "unknown": 3, "settled": 0}
    assert WhatsappMessage.objects.get(pk=accepted.pk).status == S.SENT
    assert WhatsappMessage.objects.get(pk=skipped.pk).status == S.SKIPPED
    assert _metric(outbox["campaign"]) == (1, 0, 0, 0)


# -- marketing preferences ----------------------------------------------------------------------


def _preference(wa_id: str, value: str, ts: int = T0) -> dict:
    return {"wa_id": wa_id, "detail": "", "category": "marketing_messages", "value": value, "timestamp": ts}


def _receiving_number(org: Organization, phone_number_id: str = "109876543210") -> WhatsappNumber:
    return WhatsappNumber.objects.create(
        organization=org, display_phone_number="+5511940000000", phone_number_id=phone_number_id
    )


def test_user_preferences_stop_opts_the_customer_out_and_resume_clears_it(
    client, settings, world, drain_inbox
):
    settings.WHATSAPP_APP_SECRET = SECRET
    _receiving_number(world["org"])
    ana, bruno, _ = world["customers"]
    # Bruno is stored with the ninth digit; Meta's wa_id for him may lack it.
    body = json.dumps(
        _payload(preferences=[_preference("5511999990001", "stop"), _preference("552199990002", "stop")])
    ).encode()
    response = _post(client, body)
    assert response.status_code == 200 and response.json()["accepted"] == 2
    drain_inbox()
    for customer in (ana, bruno):
        customer.refresh_from_db()
        assert customer.whatsapp_opted_out_at == datetime.fromtimestamp(T0, tz=UTC)
        assert customer.whatsapp_opt_out_source == OptOutSource.REPLY
        assert not customer.can_receive_whatsapp
    updated = dict(Customer.objects.values_list("pk", "updated_at"))
    assert _post(client, body).status_code == 200
    drain_inbox()
    assert dict(Customer.objects.values_list("pk", "updated_at")) == updated  # a retry changes nobody again

    resume = json.dumps(_payload(preferences=[_preference("5511999990001", "resume", T0 + 60)])).encode()
    assert _post(client, resume).json()["accepted"] == 1
    drain_inbox()
    ana.refresh_from_db()
    assert (ana.whatsapp_opted_out_at, ana.whatsapp_opt_out_source) == (None, "")
    assert Customer.objects.get(pk=bruno.pk).whatsapp_opted_out_at is not None


def test_a_stop_applies_only_in_the_organization_that_owns_the_receiving_number(
    client, settings, world, drain_inbox
):
    """LGPD: the same person, a customer of two retailers, says stop to one retailer's number; the
    other retailer's relationship is untouched. A number no organization has changes nobody."""
    settings.WHATSAPP_APP_SECRET = SECRET
    _receiving_number(world["org"])
    other = Organization.objects.create(name="Outra Loja", slug="outra")
    elsewhere = Customer.objects.create(
        marketing_consent=True, organization=other, erp_id="X1", name="Ana", phone="+5511999990001"
    )
    body = json.dumps(_payload(preferences=[_preference("5511999990001", "stop")])).encode()
    assert _post(client, body).status_code == 200
    drain_inbox()
    assert not Customer.objects.get(pk=world["customers"][0].pk).can_receive_whatsapp
    assert Customer.objects.get(pk=elsewhere.pk).can_receive_whatsapp
    unknown = _payload(preferences=[_preference("5511999990001", "stop")])
    unknown["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"] = "999"
    Customer.objects.filter(pk=world["customers"][0].pk).update(whatsapp_opted_out_at=None)
    assert _post(client, json.dumps(unknown).encode()).status_code == 200
    drain_inbox()
    assert inbox.pending() == 0
    assert Customer.objects.filter(whatsapp_opted_out_at__isnull=False).count() == 0


def test_the_latest_preference_wins_and_resume_keeps_an_opt_out_made_elsewhere(world):
    _receiving_number(world["org"])
    ana, bruno, _ = world["customers"]
    Customer.objects.filter(pk=bruno.pk).update(
        whatsapp_opted_out_at=timezone.now(), whatsapp_opt_out_source=OptOutSource.UNSUBSCRIBE_LINK
    )
    ts = datetime.fromtimestamp(T0, tz=UTC)
    number = "109876543210"
    events = [
        PreferenceEvent("5511999990001", "resume", ts + timedelta(seconds=9), phone_number_id=number),
        PreferenceEvent("5511999990001", "stop", ts, phone_number_id=number),
        PreferenceEvent("5521999990002", "resume", ts, phone_number_id=number),
    ]
    assert statuses.preferences_apply(events=events) == 0
    assert Customer.objects.get(pk=ana.pk).whatsapp_opted_out_at is None
    assert Customer.objects.get(pk=bruno.pk).whatsapp_opt_out_source == OptOutSource.UNSUBSCRIBE_LINK


# -- end to end: the sandbox POSTs signed webhooks to the live server ---------------------------


def _point_sandbox_at(live_server, sandbox, settings, **config: Any) -> None:
    settings.WHATSAPP_APP_SECRET = SECRET
    sandbox.configure(webhook_url=live_server.url + URL, app_secret=SECRET, **config)


def _drained(run_jobs) -> bool:
    """Let the workers apply what the webhook intake has stored so far."""
    run_jobs([queues.INBOX], settle=0)
    return True


# The send job records its outcomes after the whole batch returns; statuses arriving before that
# race it (see test_a_status_that_beats_the_send_jobs_record_is_not_undone), so these tests let
# the job finish first.
AFTER_THE_JOB = [400.0, 500.0, 600.0]


def test_sandbox_webhooks_bring_every_message_to_read(wa, sandbox, run_jobs, live_server, settings):
    _point_sandbox_at(live_server, sandbox, settings, status_delays_ms=AFTER_THE_JOB)
    wa["customers"](5)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    wait_for(
        lambda: _drained(run_jobs) and _counts(campaign) == {"read": 5} and _metric(campaign) == (5, 5, 5, 0),
        timeout=120,
        what="every message read",
    )
    # the sandbox counts a webhook once it has read our 200, a moment after we committed
    wait_for(lambda: sandbox.stats()["webhooks_delivered"] == 15, timeout=120, what="every 200 read")
    assert sandbox.stats()["webhooks_failed"] == 0
    message = WhatsappMessage.objects.filter(campaign=campaign).first()
    assert message is not None and message.sent_at and message.delivered_at and message.read_at
    # Meta's timestamps are whole seconds; ours (sent_at, from the send job) are not
    assert message.sent_at.replace(microsecond=0) <= message.delivered_at <= message.read_at
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT


def test_a_failed_status_webhook_fails_that_message_with_its_code(
    wa, sandbox, run_jobs, live_server, settings
):
    _point_sandbox_at(live_server, sandbox, settings, status_delays_ms=AFTER_THE_JOB)
    people = wa["customers"](3)
    sandbox.add_rule(to=people[1].phone.lstrip("+"), webhook_failure_code=131049)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    wait_for(
        lambda: _drained(run_jobs) and _counts(campaign) == {"read": 2, "failed": 1},
        timeout=120,
        what="two read and one failed",
    )
    failed = WhatsappMessage.objects.get(campaign=campaign, customer=people[1])
    assert failed.error_code == 131049 and failed.failed_at is not None and failed.error_reason
    assert _metric(campaign) == (3, 2, 2, 1)


def test_a_status_that_beats_the_send_jobs_record_is_not_undone(wa, sandbox, run_jobs, live_server, settings):
    _point_sandbox_at(live_server, sandbox, settings)  # Meta's real pace: statuses within ms
    number = wa["number"]
    number.messages_per_second = 2  # the batch takes ~1 s, its first message is read long before
    number.save(update_fields=["messages_per_second"])
    wa["customers"](3)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    wait_for(lambda: sandbox.stats()["webhooks_delivered"] == 9, timeout=120, what="every webhook")
    _drained(run_jobs)
    assert _counts(campaign) == {"read": 3}
    assert _metric(campaign) == (3, 3, 3, 0)
    # the cost is still counted for messages the webhook settled before the send recorded them
    from decimal import Decimal

    assert CampaignMetric.objects.get(campaign=campaign).cost == Decimal("0.0625") * 3
    assert set(WhatsappMessage.objects.filter(campaign=campaign).values_list("cost", flat=True)) == {
        Decimal("0.0625")
    }
