"""History is history: what a started campaign sent cannot change (admin, model, any other path), a
delivered link keeps its target, and a campaign with messages is archived, never deleted by a
manager — its messages and credited sales stay."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

from campaigns import lifecycle, links
from campaigns.models import Campaign, SaleAttribution, WhatsappMessage
from crm.models import Membership, Sale

ORIGINAL = "https://loja.example.com.br/bf"
EDITED = "https://loja.example.com.br/outra-coisa"


@pytest.fixture
def manager(wa) -> Client:
    user = get_user_model().objects.create_user("gerente", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=user, organization=wa["org"], role=Membership.Role.MANAGER)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def started(wa, django_capture_on_commit_callbacks) -> Campaign:
    """A WhatsApp campaign started for real (campaign_start), with one delivered message."""
    wa["customers"](2)
    campaign = wa["campaign"](redirect_url=ORIGINAL)
    with django_capture_on_commit_callbacks(execute=False):
        campaign = lifecycle.campaign_start(campaign=campaign)
    customer = campaign.organization.customers.order_by("pk")[0]
    WhatsappMessage.objects.create(
        campaign=campaign,
        organization=campaign.organization,
        customer=customer,
        status=WhatsappMessage.Status.DELIVERED,
        phone=customer.phone,
        sent_at=timezone.now(),
    )
    return campaign


def _form(campaign: Campaign, **changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "organization": campaign.organization_id,
        "name": campaign.name,
        "channel": campaign.channel,
        "whatsapp_number": campaign.whatsapp_number_id,
        "sender": campaign.sender,
        "template_name": campaign.template_name,
        "template_language": campaign.template_language,
        "template_category": campaign.template_category,
        "template_variables": '["first_name"]',
        "redirect_url": campaign.redirect_url,
        "redirect_button_index": 0,
        "unsubscribe_button_index": 1,
        "recurrence_misfire": campaign.recurrence_misfire,
        "_save": "Save",
    }
    data.update(changes)
    return data


def test_a_started_campaigns_content_cannot_change_through_the_model(started):
    campaign = Campaign.objects.get(pk=started.pk)
    campaign.redirect_url = EDITED
    with pytest.raises(ValidationError):
        campaign.full_clean()
    with pytest.raises(ValidationError):
        campaign.save()
    campaign = Campaign.objects.get(pk=started.pk)
    campaign.template_variables = ["store_name"]
    with pytest.raises(ValidationError):
        campaign.save(update_fields=["template_variables"])
    assert Campaign.objects.get(pk=started.pk).redirect_url == ORIGINAL
    # What is not content stays editable: the name.
    campaign = Campaign.objects.get(pk=started.pk)
    campaign.name = "Black Friday (enviada)"
    campaign.save()
    assert Campaign.objects.get(pk=started.pk).name == "Black Friday (enviada)"


def test_a_draft_campaign_is_still_edited_freely(wa):
    campaign = wa["campaign"]()
    campaign.redirect_url = EDITED
    campaign.full_clean()
    campaign.save()
    assert Campaign.objects.get(pk=campaign.pk).redirect_url == EDITED


def test_a_manager_sees_a_sent_campaigns_content_read_only_and_cannot_change_it(started, manager):
    url = f"/admin/campaigns/campaign/{started.pk}/change/"
    page = manager.get(url)
    assert page.status_code == 200
    assert b'name="redirect_url"' not in page.content and b'name="template_name"' not in page.content
    assert b'name="whatsapp_template"' not in page.content  # no picker offering another template
    response = manager.post(url, _form(started, redirect_url=EDITED, template_name="outro"))
    assert response.status_code in (200, 302)
    stored = Campaign.objects.get(pk=started.pk)
    assert (stored.redirect_url, stored.template_name) == (ORIGINAL, "promo_bf")


def test_a_delivered_link_goes_where_it_pointed_when_it_was_sent(started):
    message = WhatsappMessage.objects.get(campaign=started)
    # Whatever path changes the campaign afterwards (here below the model's guard), the link holds.
    Campaign.objects.filter(pk=started.pk).update(redirect_url=EDITED)
    response = Client().get("/" + links.link_path("r", message))
    assert (response.status_code, response["Location"]) == (302, ORIGINAL)


def test_a_manager_cannot_delete_a_campaign_with_messages_and_archives_it_instead(started, manager):
    customer = WhatsappMessage.objects.get(campaign=started).customer
    store = started.organization.stores.first()
    sale = Sale.objects.create(
        organization=started.organization,
        store=store,
        customer=customer,
        erp_id="S-1",
        total=Decimal("199.90"),
        sold_at=timezone.now(),
    )
    assert SaleAttribution.objects.filter(sale=sale, campaign=started).exists()
    # Asked to delete it, the manager is told why not and what to do instead (it answered the
    # generic "access denied, ask your organization's manager" to the manager).
    for ask in (manager.get, lambda url: manager.post(url, {"post": "yes"})):
        response = ask(f"/admin/campaigns/campaign/{started.pk}/delete/")
        assert response.status_code == 403
        assert "Campanhas com mensagens são arquivadas, não excluídas" in response.content.decode()
    manager.post(
        "/admin/campaigns/campaign/",
        {"action": "delete_selected", "_selected_action": [started.pk], "post": "yes"},
    )
    assert Campaign.objects.filter(pk=started.pk).exists()

    Campaign.objects.filter(pk=started.pk).update(status=Campaign.Status.SENT, finished_at=timezone.now())
    manager.post("/admin/campaigns/campaign/", {"action": "archive", "_selected_action": [started.pk]})
    archived = Campaign.objects.get(pk=started.pk)
    assert archived.archived_at is not None
    row = f"/admin/campaigns/campaign/{started.pk}/change/".encode()
    assert row not in manager.get("/admin/campaigns/campaign/").content
    assert row in manager.get("/admin/campaigns/campaign/?archived=yes").content
    assert row in manager.get("/admin/campaigns/campaign/?archived=all").content
    assert WhatsappMessage.objects.filter(campaign=started).count() == 1
    assert SaleAttribution.objects.filter(sale=sale, campaign=started).exists()


def test_a_campaign_without_messages_can_still_be_deleted_by_a_manager(wa, manager):
    campaign = wa["campaign"]()
    response = manager.post(f"/admin/campaigns/campaign/{campaign.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Campaign.objects.filter(pk=campaign.pk).exists()


def test_a_sending_campaign_cannot_be_archived(started):
    with pytest.raises(lifecycle.CampaignError):
        lifecycle.campaign_archive(campaign=started)
    assert Campaign.objects.get(pk=started.pk).archived_at is None
