"""The inbox serves organizations in turn (issue 28): one tenant's webhook storm never makes another
tenant's statuses wait behind it, and each tenant's events are still applied in acceptance order."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from django.test import override_settings
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from campaigns.models import Campaign, CampaignMetric, WhatsappMessage
from crm import inbox, inbox_kinds
from crm.models import Customer, InboxEvent, Organization
from integrations.models import WhatsappNumber
from integrations.whatsapp import webhooks

APP_SECRET = "meta-app-secret-for-inbox-fairness"
T0 = 1_731_700_000
S = WhatsappMessage.Status
FLOOD = 3_000  # tenant A's backlog: six batches of inbox.BATCH


def _body(number: str, wamid: str, status: str, ts: int = T0) -> str:
    value = {
        "messaging_product": "whatsapp",
        "metadata": {"phone_number_id": number},
        "statuses": [{"id": wamid, "status": status, "timestamp": str(ts), "recipient_id": "5511900000000"}],
    }
    change = {"field": "messages", "value": value}
    return json.dumps({"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": [change]}]})


def _tenant(slug: str, number: str) -> tuple[Organization, WhatsappMessage]:
    org = Organization.objects.create(name=f"Loja {slug}", slug=slug)
    WhatsappNumber.objects.create(
        organization=org, display_phone_number="+5511955550000", phone_number_id=number
    )
    campaign = Campaign.objects.create(organization=org, name="Fila", status=Campaign.Status.SENDING)
    CampaignMetric.objects.create(campaign=campaign, queued=1, sent=1)
    customer = Customer.objects.create(organization=org, name="Cliente", phone="+5511960000001")
    message = WhatsappMessage.objects.create(
        campaign=campaign,
        organization=org,
        customer=customer,
        status=S.SENT,
        phone=customer.phone,
        wa_id="5511960000001",
        wamid=f"wamid.FAIR-{slug}",
        sent_at=timezone.now(),
    )
    return org, message


def _post(client, body: str) -> None:
    digest = hmac.new(APP_SECRET.encode(), body.encode(), hashlib.sha256).hexdigest()
    response = client.post(
        "/webhooks/whatsapp/",
        body,
        content_type="application/json",
        headers={"X-Hub-Signature-256": f"sha256={digest}"},
    )
    assert response.status_code == 200, response.content


@pytest.fixture
def meta(settings):
    settings.WHATSAPP_APP_SECRET = APP_SECRET


def test_a_tenants_status_is_applied_before_another_tenants_flood_drains(db, client, meta):
    """A floods the inbox with FLOOD status callbacks; B's one callback, accepted after all of them,
    is applied by the very next batch, while most of A's backlog still waits."""
    org_a, message_a = _tenant("flood", "pn-a")
    org_b, message_b = _tenant("calm", "pn-b")
    _post(client, _body("pn-a", message_a.wamid or "", "delivered"))
    flood = _body("pn-a", "wamid.UNKNOWN", "delivered")
    InboxEvent.objects.bulk_create(
        [InboxEvent(kind="whatsapp", organization=org_a, payload=flood) for _ in range(FLOOD)]
    )
    _post(client, _body("pn-b", message_b.wamid or "", "read"))
    assert set(InboxEvent.objects.values_list("organization_id", flat=True)) == {org_a.pk, org_b.pk}

    inbox.drain_batch("whatsapp")

    message_a.refresh_from_db()
    message_b.refresh_from_db()
    assert message_b.status == S.READ  # B's turn came in the first batch
    assert message_a.status == S.DELIVERED  # and A's oldest events were served in it too
    assert inbox.pending("whatsapp") == FLOOD + 2 - inbox.BATCH
    assert not InboxEvent.objects.filter(organization=org_b).exists()


def test_a_body_for_an_unknown_number_is_kept_without_an_organization_and_still_served(db, client, meta):
    org_a, _ = _tenant("known", "pn-known")
    InboxEvent.objects.bulk_create(
        [InboxEvent(kind="whatsapp", organization=org_a, payload=_body("pn-known", "wamid.X", "sent"))] * 800
    )
    _post(client, _body("pn-nobody", "wamid.NOBODY", "delivered"))
    stray = InboxEvent.objects.get(organization__isnull=True)
    inbox.drain_batch("whatsapp")
    assert not InboxEvent.objects.filter(pk=stray.pk).exists()


def test_each_tenants_events_keep_their_acceptance_order(db, monkeypatch):
    """The handler gets, per organization, a prefix of its events in acceptance order."""
    seen: list[tuple[int | None, int]] = []

    def record(events: list[inbox_kinds.Event]) -> None:
        seen.extend((e.organization_id, e.id) for e in events)

    monkeypatch.setitem(inbox_kinds._HANDLERS, "test.fair-order", record)

    orgs = [Organization.objects.create(name=f"Ordem {i}", slug=f"ordem-{i}") for i in range(3)]
    rows = [
        InboxEvent(kind="test.fair-order", organization=orgs[i % 3] if i % 7 else None, payload="{}")
        for i in range(90)
    ]
    InboxEvent.objects.bulk_create(rows)
    while inbox.drain_batch("test.fair-order", limit=10):
        pass
    assert sorted(i for _, i in seen) == sorted(r.pk for r in rows)  # each once
    for tenant in [*orgs, None]:
        ids = [i for o, i in seen if o == (tenant.pk if tenant else None)]
        assert ids == sorted(ids)


def test_organizations_beyond_a_batchs_turns_are_served_in_the_next_one(db, monkeypatch):
    """With more organizations waiting than ORGS_PER_BATCH, batches rotate over them."""
    monkeypatch.setattr(inbox, "ORGS_PER_BATCH", 3)
    batches: list[set[int | None]] = []

    def record(events: list[inbox_kinds.Event]) -> None:
        batches.append({e.organization_id for e in events})

    monkeypatch.setitem(inbox_kinds._HANDLERS, "test.fair-rotate", record)

    orgs = [Organization.objects.create(name=f"Giro {i}", slug=f"giro-{i}") for i in range(5)]
    InboxEvent.objects.bulk_create(
        [InboxEvent(kind="test.fair-rotate", organization=o, payload="{}") for o in orgs for _ in range(10)]
    )
    inbox.drain_batch("test.fair-rotate", limit=3)
    inbox.drain_batch("test.fair-rotate", limit=3)
    assert batches[0] == {o.pk for o in orgs[:3]}
    assert batches[1] >= {o.pk for o in orgs[3:]}


@given(st.lists(st.text(max_size=12), max_size=3), st.booleans())
def test_the_number_a_body_is_for_is_its_first_changes_metadata(numbers, with_metadata):
    changes = [
        {"field": "messages", "value": {"metadata": {"phone_number_id": n}} if with_metadata else {}}
        for n in numbers
    ]
    payload = {"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": changes}]}
    expected = next((n for n in numbers if n), "") if with_metadata else ""
    assert webhooks.phone_number_id(payload) == expected


def test_a_drain_whose_shared_batches_are_slow_takes_smaller_ones_and_still_applies_everything(
    db, monkeypatch, settings
):
    """A full batch of several organizations slower than INBOX_BATCH_SECONDS (a loaded machine)
    makes the next one smaller, so another organization's event waits less behind it; every event
    is still applied once."""
    settings.INBOX_BATCH_SECONDS = 1e-9  # every batch is slower than that
    sizes: list[int] = []

    def record(events: list[inbox_kinds.Event]) -> None:
        sizes.append(len(events))

    monkeypatch.setitem(inbox._HANDLERS, "test.fair-slow", record)
    a, b = (Organization.objects.create(name=f"Lenta {s}", slug=f"lenta-{s}") for s in "ab")
    InboxEvent.objects.bulk_create(
        [InboxEvent(kind="test.fair-slow", organization=a, payload="{}") for _ in range(1_200)]
        + [InboxEvent(kind="test.fair-slow", organization=b, payload="{}") for _ in range(1_200)]
    )
    assert inbox.drain(kind="test.fair-slow", budget=600) == 2_400
    assert sizes[0] == inbox.BATCH and sizes[1] == inbox.MIN_BATCH, sizes  # a shared batch of 500 was slow
    assert sum(sizes) == 2_400 and not InboxEvent.objects.filter(kind="test.fair-slow").exists()


def test_a_tenant_alone_keeps_full_batches_however_slow(db, monkeypatch, settings):
    """Its throughput: nobody else waits behind its batches."""
    settings.INBOX_BATCH_SECONDS = 1e-9
    sizes: list[int] = []
    monkeypatch.setitem(inbox._HANDLERS, "test.fair-alone", lambda events: sizes.append(len(events)))
    org = Organization.objects.create(name="Sozinha", slug="sozinha")
    InboxEvent.objects.bulk_create(
        [InboxEvent(kind="test.fair-alone", organization=org, payload="{}") for _ in range(1_200)]
    )
    assert inbox.drain(kind="test.fair-alone", budget=600) == 1_200
    assert sizes == [inbox.BATCH, inbox.BATCH, 200]


@given(
    previous=st.integers(1, inbox.BATCH),
    taken=st.integers(0, inbox.BATCH),
    seconds=st.floats(0, 1e6, allow_nan=False),
    target=st.sampled_from([0.0, 0.05, 0.2, 1.0]),
)
def test_the_shared_batch_size_stays_within_its_bounds(previous, taken, seconds, target):
    with override_settings(INBOX_BATCH_SECONDS=target):
        size = inbox.shared_limit(previous, taken, seconds)
    if target == 0:
        assert size == inbox.BATCH
    elif taken < inbox.MIN_BATCH or seconds == 0:
        assert size == previous  # nothing to measure by
    else:
        assert inbox.MIN_BATCH <= size <= inbox.BATCH
        assert size <= max(taken, inbox.MIN_BATCH) or seconds < target  # a slow batch: a smaller next one
