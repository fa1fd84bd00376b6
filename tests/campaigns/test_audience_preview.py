"""Before the start, the campaign page shows who will receive it, who is skipped by reason and the
estimated cost in the rate card's currency, by the fan-out's own rules; an empty audience cannot
start (the command exits non-zero naming why, the page says so); the page's start, pause and
cancel buttons confirm with the audience's size and cost. Sent for real through the Meta sandbox."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone, translation

from campaigns import audience, lifecycle, tasks
from campaigns.models import Campaign, WhatsappMessage
from crm.models import Customer, Membership, Organization


def _manager(org) -> Client:
    user = get_user_model().objects.create_user("gerente", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=user, organization=org, role=Membership.Role.MANAGER)
    client = Client(HTTP_ACCEPT_LANGUAGE="en")  # the assertions read English; pt-BR: test_one_language
    client.force_login(user)
    return client


def _world(wa) -> dict:
    """Five consenting customers (one of them sent another campaign an hour ago), two without
    consent, one opted out, one without a phone."""
    people = wa["customers"](5)
    org = wa["org"]
    Customer.objects.create(organization=org, name="Sem A", phone="+5511970000001")
    Customer.objects.create(organization=org, name="Sem B", phone="+5511970000002")
    wa["customers"](1, start=50, phone="+5511970000003")[0]
    Customer.objects.filter(phone="+5511970000003").update(whatsapp_opted_out_at=timezone.now())
    wa["customers"](1, start=60, phone="")
    earlier = wa["campaign"](name="Earlier", status=Campaign.Status.SENT, started_at=timezone.now())
    WhatsappMessage.objects.create(
        campaign=earlier,
        organization=org,
        customer=people[0],
        status=WhatsappMessage.Status.SENT,
        sent_at=timezone.now() - timedelta(hours=1),
    )
    return {"people": people}


def test_the_preview_counts_receivers_and_skips_by_reason_with_the_cost_in_its_currency(wa):
    _world(wa)
    campaign = wa["campaign"]()
    preview = audience.audience_preview(campaign=campaign)
    assert preview.selected == 9
    assert preview.receives == 4
    assert preview.skipped == {
        "no_consent": 2,
        "opted_out": 1,
        "no_contact": 1,
        "suppressed": 0,
        "contact_cap": 0,
        "another_campaign": 1,
        "global_holdout": 0,
        "control_group": 0,
    }
    assert (preview.cost, preview.currency) == (4 * Decimal("0.0625"), "USD")
    assert preview.problem == ""


def test_the_preview_leaves_out_the_expected_control_group(wa):
    campaign = wa["campaign"]()
    before = audience.audience_preview(campaign=campaign)
    Campaign.objects.filter(pk=campaign.pk).update(control_percent=50)
    campaign.refresh_from_db()
    preview = audience.audience_preview(campaign=campaign)
    held = round(before.receives * 50 / 100)
    assert preview.skipped["control_group"] == held
    assert preview.receives == before.receives - held


def test_the_page_shows_the_audience_and_its_cost_and_the_fan_out_agrees(wa, sandbox, run_jobs):
    _world(wa)
    campaign = wa["campaign"]()
    client = _manager(wa["org"])
    page = client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert '<strong data-field="receives">4</strong>' in page
    assert 'data-skip="another_campaign">1<' in page and 'data-skip="no_consent">2<' in page
    assert "US$0.25" in page or "US$ 0,25" in page
    # The confirmation repeats the size and the cost; the POST starts it.
    confirm = client.get(f"/admin/campaigns/campaign/{campaign.pk}/start/").content.decode()
    assert "It will be sent to 4 customers" in confirm and "US$0.25" in confirm
    client.post(f"/admin/campaigns/campaign/{campaign.pk}/start/")
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENDING
    run_jobs()
    sent = WhatsappMessage.objects.filter(campaign=campaign, status__in=["sent", "delivered", "read"])
    assert sent.count() == len(sandbox.messages()) == 4
    assert WhatsappMessage.objects.filter(campaign=campaign, status="skipped").count() == 1


def test_an_empty_audience_cannot_start_and_the_command_and_the_page_say_why(wa):
    org = wa["org"]
    Customer.objects.create(organization=org, name="Sem A", phone="+5511970000001")
    campaign = wa["campaign"]()
    with translation.override("en"), pytest.raises(lifecycle.EmptyAudience, match="1 no consent"):
        lifecycle.campaign_start(campaign=campaign)
    with (
        translation.override("pt-br"),
        pytest.raises(CommandError, match="ninguém a receberia: 1 sem consent"),
    ):
        call_command("campaign_start", str(campaign.pk), stdout=StringIO())
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.DRAFT and not WhatsappMessage.objects.exists()
    client = _manager(org)
    page = client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert 'id="audience-problem"' in page
    confirm = client.get(f"/admin/campaigns/campaign/{campaign.pk}/start/").content.decode()
    assert 'id="lifecycle-yes"' not in confirm and "nobody would receive it" in confirm
    client.post(f"/admin/campaigns/campaign/{campaign.pk}/start/")
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.DRAFT


def test_a_segment_campaign_without_a_snapshot_is_refused_naming_the_snapshot(wa):
    wa["customers"](3)
    campaign = wa["campaign"](audience_segment="champions")
    with translation.override("en"), pytest.raises(lifecycle.EmptyAudience, match="no segment snapshot yet"):
        lifecycle.campaign_start(campaign=campaign)


def test_a_scheduled_campaign_with_nobody_to_receive_it_stops_with_the_reason(wa):
    campaign = wa["campaign"](status=Campaign.Status.SCHEDULED)
    with translation.override("en"):
        tasks.campaign_trigger(campaign.pk)
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.STOPPED
    assert "no customer matches" in campaign.stop_reason


def test_pause_and_cancel_buttons_confirm_with_what_is_left(wa, run_jobs):
    wa["customers"](3)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs(["campaign-trigger"])  # fanned out: three queued, none sent
    client = _manager(wa["org"])
    page = client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert 'id="lifecycle-pause"' in page and 'id="lifecycle-start"' not in page
    confirm = client.get(f"/admin/campaigns/campaign/{campaign.pk}/pause/").content.decode()
    assert "3 messages wait" in confirm
    client.post(f"/admin/campaigns/campaign/{campaign.pk}/pause/")
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.PAUSED
    confirm = client.get(f"/admin/campaigns/campaign/{campaign.pk}/cancel/").content.decode()
    assert "The 3 messages not yet sent will never be sent" in confirm
    client.post(f"/admin/campaigns/campaign/{campaign.pk}/cancel/")
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.CANCELLED
    assert WhatsappMessage.objects.filter(campaign=campaign, status="cancelled").count() == 3


def test_the_forms_live_count_follows_the_audience_fields_and_the_organizations_scope(wa):
    _world(wa)
    client = _manager(wa["org"])
    url = "/admin/campaigns/campaign/audience-count/"
    everyone = client.get(url, {"organization": wa["org"].pk, "channel": "whatsapp"}).json()
    assert (everyone["selected"], everyone["receives"]) == (9, 5)  # caps apart: counted once saved
    none = client.get(url, {"organization": wa["org"].pk, "audience_purchases_min": "1"}).json()
    assert (none["selected"], none["receives"]) == (0, 0)
    bad = client.get(url, {"organization": wa["org"].pk, "audience_birthday_month": "13"})
    assert bad.status_code == 400
    other = Organization.objects.create(name="Outra", slug="outra")
    assert client.get(url, {"organization": other.pk}).status_code == 404
    assert client.get(url).json() == {}  # no organization chosen yet
    page = client.get(f"/admin/campaigns/campaign/{wa['campaign']().pk}/change/").content.decode()
    assert "audience-live" in page and "/admin/campaigns/campaign/audience-count/" in page
