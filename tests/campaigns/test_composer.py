"""The composer: a template picked from those synced from Meta (the sandbox, over real HTTP), its
{{n}} mapped to named customer variables, the message previewed for a real customer from the number
it goes from, a rejected or paused template refused, and a test send that reaches the sandbox
without being a campaign message."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from campaigns import composer, lifecycle, recurring, test_sends
from campaigns.models import Campaign, CampaignMetric, Sender, TestSend, WhatsappMessage
from campaigns.recurrence import next_occurrences, recurrence_error
from crm.models import Customer, Membership, Sale, Store
from integrations.models import WhatsappNumber, WhatsappTemplate
from integrations.services import whatsapp_templates_sync

WABA = "102290129340398"


@pytest.fixture
def synced(wa) -> dict:
    number = wa["number"]
    number.business_account_id = WABA
    number.save(update_fields=["business_account_id"])
    assert whatsapp_templates_sync(number=number)["approved"] == 5
    return wa


@pytest.fixture
def manager(synced) -> Client:
    user = User.objects.create_user("gerente", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=user, organization=synced["org"], role="manager")
    client = Client()
    client.force_login(user)
    return client


def _add_form(synced, **changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "organization": synced["org"].pk,
        "name": "Ofertas",
        "channel": "whatsapp",
        "whatsapp_number": synced["number"].pk,
        "sender": "campaign",
        "template_name": "",
        "template_language": "pt_BR",
        "template_category": "marketing",
        "email_body_format": "mjml",
        "recurrence_misfire": "skip",
        "_save": "Save",
    }
    data.update(changes)
    return data


def _template(name: str, language: str = "pt_BR") -> WhatsappTemplate:
    return WhatsappTemplate.objects.get(name=name, language=language)


def test_a_manager_picks_a_synced_template_and_maps_its_variables(synced, manager) -> None:
    promo = _template("promo_demo")
    page = manager.get("/admin/campaigns/campaign/add/", {"organization": synced["org"].pk})
    assert page.status_code == 200
    response = manager.post(
        "/admin/campaigns/campaign/add/",
        _add_form(
            synced,
            whatsapp_template=promo.pk,
            template_variables_0="first_name",
            template_variables_1="store_name",
        ),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    campaign = Campaign.objects.get(name="Ofertas")
    assert (campaign.template_name, campaign.template_language, campaign.template_category) == (
        "promo_demo",
        "pt_BR",
        "marketing",
    )
    assert campaign.template_variables == ["first_name", "store_name"]
    change = manager.get(f"/admin/campaigns/campaign/{campaign.pk}/change/")
    assert (
        f'value="{promo.pk}" selected data-waba="{WABA}"'.encode() in change.content
    )  # picked again on edit


def test_a_manager_of_one_organization_finds_it_chosen_and_its_templates_offered(synced, manager) -> None:
    """The add form opened from the home page has no ?organization: a manager of one organization
    must not have to pick it (and reload) before the synced templates are offered."""
    page = manager.get("/admin/campaigns/campaign/add/").content.decode()
    org = synced["org"].pk
    assert f'<option value="{org}" selected>' in page
    assert f'value="{_template("promo_demo").pk}" data-waba="{WABA}"' in page


def test_rejected_and_paused_templates_are_not_offered_and_a_wrong_mapping_is_refused(
    synced, manager
) -> None:
    page = manager.get("/admin/campaigns/campaign/add/", {"organization": synced["org"].pk}).content.decode()
    assert "aniversario" in page and "black_friday" not in page and "reativacao" not in page
    for name in ("black_friday", "reativacao"):
        response = manager.post(
            "/admin/campaigns/campaign/add/",
            _add_form(synced, whatsapp_template=_template(name).pk, template_variables_0="first_name"),
        )
        assert "whatsapp_template" in response.context["adminform"].form.errors
    one_of_two = manager.post(
        "/admin/campaigns/campaign/add/",
        _add_form(synced, whatsapp_template=_template("promo_demo").pk, template_variables_0="first_name"),
    )
    assert "template_variables" in one_of_two.context["adminform"].form.errors
    unknown = manager.post(
        "/admin/campaigns/campaign/add/",
        _add_form(synced, whatsapp_template=_template("pedido_enviado").pk, template_variables_0="cpf"),
    )
    assert "template_variables" in unknown.context["adminform"].form.errors
    assert not Campaign.objects.exists()


@pytest.mark.parametrize("name", ["black_friday", "reativacao"])
def test_a_campaign_naming_a_rejected_or_paused_template_does_not_start(synced, name, english) -> None:
    campaign = synced["campaign"](template_name=name, template_variables=["first_name"])
    synced["customers"](2)
    with pytest.raises(lifecycle.CampaignError, match="cannot be sent"):
        lifecycle.campaign_start(campaign=campaign)
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.DRAFT
    missing = synced["campaign"](name="x", template_name="nao_existe")
    with pytest.raises(lifecycle.CampaignError, match="not among"):
        lifecycle.campaign_start(campaign=missing)


def test_the_preview_is_the_message_from_the_customers_store_number(synced, sandbox) -> None:
    org = synced["org"]
    own = WhatsappNumber(
        organization=org,
        display_phone_number="+5511940000009",
        phone_number_id="109876543219",
        graph_url=sandbox.url,
    )
    own.set_access_token("t")
    own.save()
    shopping = Store.objects.create(organization=org, erp_code="002", name="Shopping", whatsapp_number=own)
    ana, bia = synced["customers"](2, name="Ana Souza")
    Sale.objects.create(
        organization=org,
        store=shopping,
        customer=ana,
        erp_id="S1",
        total=Decimal("10"),
        sold_at=timezone.now() - timedelta(days=1),
    )
    campaign = synced["campaign"](
        template_name="promo_demo", template_variables=["first_name", "store_name"], sender=Sender.STORE
    )
    by_customer = {r.customer.pk: r for r in (composer.render_for(campaign, c) for c in (ana, bia))}
    assert by_customer[ana.pk].number == own
    assert by_customer[ana.pk].text.startswith("Olá Ana! A Shopping preparou")
    assert by_customer[bia.pk].number == synced["number"]  # no sale: the campaign's number
    assert "A Centro preparou" in by_customer[bia.pk].text
    html = composer.preview_html(campaign, [ana, bia])
    assert "+5511940000009 (Shopping)" in html and "Olá Ana! A Shopping" in html


def test_a_test_send_reaches_the_sandbox_and_is_no_campaign_message(
    synced, manager, sandbox, run_jobs, django_capture_on_commit_callbacks
) -> None:
    (customer,) = synced["customers"](1, name="Maria Lima")
    campaign = synced["campaign"](template_name="promo_demo", template_variables=["first_name", "store_name"])
    with django_capture_on_commit_callbacks(execute=True):
        response = manager.post(
            f"/admin/campaigns/campaign/{campaign.pk}/test-send/",
            {"customer": customer.pk, "to": "(11) 99000-0000"},
        )
    assert response.status_code == 302
    run_jobs()
    test = TestSend.objects.get(campaign=campaign)
    assert (test.status, test.to) == (TestSend.Status.SENT, "+5511990000000"), test.error
    (sent,) = sandbox.messages(to="5511990000000")
    assert sent["wamid"] == test.wamid
    body = next(c for c in sent["template"]["components"] if c["type"] == "body")
    assert [p["text"] for p in body["parameters"]] == ["Maria", "Centro"]
    assert not WhatsappMessage.objects.filter(campaign=campaign).exists()
    assert not CampaignMetric.objects.filter(campaign=campaign).exists()
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.DRAFT
    page = manager.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert "+5511990000000" in page and 'id="test-send"' in page


def test_a_test_send_is_refused_once_the_campaign_started_or_to_a_non_phone(synced) -> None:
    (customer,) = synced["customers"](1)
    campaign = synced["campaign"](template_name="pedido_enviado", template_variables=["first_name"])
    with pytest.raises(lifecycle.CampaignError):
        test_sends.test_send_request(campaign=campaign, customer=customer, to="não sei", user_id=None)
    Campaign.objects.filter(pk=campaign.pk).update(status=Campaign.Status.SENT)
    campaign.refresh_from_db()
    with pytest.raises(lifecycle.CampaignError):
        test_sends.test_send_request(campaign=campaign, customer=customer, to="11990000000", user_id=None)
    other = Customer.objects.create(organization=synced["org"], erp_id="X", name="X", phone="+5511990000001")
    assert other.organization_id == campaign.organization_id
    assert not TestSend.objects.exists()


@given(st.text(max_size=40))
def test_any_recurrence_text_is_read_or_refused_with_examples(text) -> None:
    problem = recurrence_error(text)
    assert problem == "" or "0 9 * * 1" in problem


def test_recurrence_in_words_is_refused_with_an_example_and_shown_in_the_organizations_zone(
    synced, manager
) -> None:
    promo = _template("pedido_enviado")
    form = _add_form(synced, whatsapp_template=promo.pk, template_variables_0="first_name")
    refused = manager.post("/admin/campaigns/campaign/add/", {**form, "recurrence": "toda segunda 9h"})
    errors = refused.context["adminform"].form.errors["recurrence"]
    assert "toda segunda 9h" in errors[0] and "0 9 * * 1" in errors[0]
    saved = manager.post("/admin/campaigns/campaign/add/", {**form, "recurrence": "0 9 * * 1"})
    assert saved.status_code == 302
    campaign = Campaign.objects.get()
    page = manager.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert 'id="recurrence-next"' in page and "America/Sao_Paulo" in page
    assert '<span id="recurrence-words">Toda segunda-feira às 09:00:</span>' in page
    runs = next_occurrences("0 9 * * 1", "America/Sao_Paulo")
    assert all((r.weekday(), r.hour, r.minute) == (0, 9, 0) for r in runs)
    Campaign.objects.filter(pk=campaign.pk).update(recurrence="toda segunda 9h")
    with pytest.raises(lifecycle.CampaignError, match="0 9 \\* \\* 1"):
        recurring.campaign_recurrence_activate(campaign=Campaign.objects.get(pk=campaign.pk))
