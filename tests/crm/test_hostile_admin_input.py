"""Bad input from a tenant's people never becomes a 500 or stuck work: the admin's lists and forms,
the commands, and the send path that builds on what was saved."""

from __future__ import annotations

from datetime import date
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction
from django.test import Client

from campaigns import lifecycle
from campaigns.models import Campaign, Channel
from crm import recovery
from crm.models import Membership
from integrations.models import EmailSettings

pytestmark = pytest.mark.django_db
AUDIENCE_MAX_DAYS = 36_500  # campaigns.models: a hundred years
User = get_user_model()


@pytest.fixture
def clients(world) -> dict[str, Client]:
    """A superuser and a manager of the world's organization, logged in; errors come back as pages."""
    root = User.objects.create_superuser("root", password="pw-root-1234")
    manager = User.objects.create_user("manu", password="pw-manu-1234")
    Membership.objects.create(user=manager, organization=world["org"], role="manager")
    made = {}
    for role, user in (("superuser", root), ("manager", manager)):
        made[role] = Client(raise_request_exception=False)
        made[role].force_login(user)
    return made


def _campaign_form(world, **fields: str) -> dict[str, object]:
    """The campaign add form as a manager posts it, with `fields` changed."""
    return {
        "organization": world["org"].pk,
        "name": "campanha",
        "channel": "email",
        "email_body_format": "mjml",
        "sender": "campaign",
        "template_language": "pt_BR",
        "template_category": "marketing",
        "template_variables": "[]",
        "recurrence_misfire": "skip",
        **fields,
    }


def test_a_day_that_is_not_a_date_on_the_segments_list_is_refused_not_a_500(clients) -> None:
    for role, client in clients.items():
        for day in ("abc", "2026-02-30", "0000-00-00", "9" * 40):
            response = client.get("/admin/campaigns/customersegment/", {"day": day})
            assert response.status_code < 500, (role, day, response.status_code)


def test_a_nul_in_a_search_filter_or_autocomplete_term_is_a_400(clients) -> None:
    client = clients["manager"]
    autocomplete = client.get(
        "/admin/autocomplete/",
        {"app_label": "crm", "model_name": "sale", "field_name": "customer", "term": "ana\x00"},
    )
    assert autocomplete.status_code == 400
    for url, params in (
        ("/admin/crm/customer/", {"q": "a\x00b"}),
        ("/admin/campaigns/whatsappmessage/", {"q": "+55\x00"}),
        ("/admin/crm/customer/", {"organization__id__exact": "1\x00"}),
        ("/admin/crm/customer/", {"name\x00": "x"}),
    ):
        assert client.get(url, params).status_code == 400, (url, params)
    assert client.get("/admin/crm/customer/", {"q": "ana"}).status_code == 200


def test_a_purchase_window_beyond_the_limit_is_refused_by_the_form_and_the_database(world, clients) -> None:
    response = clients["manager"].post(
        "/admin/campaigns/campaign/add/",
        _campaign_form(world, name="janela enorme", audience_purchased_within_days="999999999"),
    )
    assert response.status_code == 200
    assert "audience_purchased_within_days" in response.context["adminform"].form.errors
    assert not Campaign.objects.filter(name="janela enorme").exists()
    campaign = Campaign.objects.create(organization=world["org"], name="ok", channel=Channel.EMAIL)
    with pytest.raises(IntegrityError), transaction.atomic():
        Campaign.objects.filter(pk=campaign.pk).update(audience_purchased_within_days=AUDIENCE_MAX_DAYS + 1)
    Campaign.objects.filter(pk=campaign.pk).update(audience_purchased_within_days=AUDIENCE_MAX_DAYS)
    page = clients["manager"].get(f"/admin/campaigns/campaign/{campaign.pk}/change/")
    assert page.status_code == 200


def test_a_fan_out_that_fails_for_good_stops_its_campaign(world) -> None:
    campaign = Campaign.objects.create(
        organization=world["org"], name="sem saída", channel=Channel.EMAIL, status=Campaign.Status.SENDING
    )
    recovery.give_up(
        func="campaigns.tasks.campaign_fanout",
        kwargs={"campaign_id": campaign.pk},
        reason="OverflowError on its last attempt: date value out of range",
        error=OverflowError("date value out of range"),
    )
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.STOPPED
    assert "OverflowError" in campaign.stop_reason


def test_a_sender_name_with_a_line_break_is_refused_by_the_form_and_at_the_start(world, clients) -> None:
    EmailSettings.objects.create(
        organization=world["org"], sender_name="Loja", sender_email="ofertas@loja.example.com.br"
    )
    settings_pk = EmailSettings.objects.get().pk
    response = clients["manager"].post(
        f"/admin/integrations/emailsettings/{settings_pk}/change/",
        {
            "organization": world["org"].pk,
            "sender_name": "Loja\r\nBcc: todos@example.com",
            "sender_email": "ofertas@loja.example.com.br",
            "messages_per_minute": "300",
            "provider": "smtp",
            "port": "587",
            "security": "starttls",
        },
    )
    assert response.status_code == 200
    assert "sender_name" in response.context["adminform"].form.errors
    assert EmailSettings.objects.get().sender_name == "Loja"
    # A name saved before the validator existed: the campaign does not start.
    EmailSettings.objects.update(sender_name="Loja\nTeste")
    campaign = Campaign.objects.create(
        organization=world["org"],
        name="e-mail",
        channel=Channel.EMAIL,
        email_subject="Oi",
        email_body="<mjml><mj-body><mj-section><mj-column><mj-text>Oi</mj-text></mj-column></mj-section></mj-body></mjml>",
    )
    with pytest.raises(lifecycle.CampaignError):
        lifecycle.campaign_start(campaign=campaign)
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.DRAFT


@pytest.mark.parametrize("day", ["0001-01-01", "9999-12-31", "2026-02-30", "ontem"])
def test_segments_snapshot_refuses_a_day_out_of_range_in_one_line(world, day: str) -> None:
    with pytest.raises(CommandError, match="--date"):
        call_command("segments_snapshot", "--date", day, stdout=StringIO(), stderr=StringIO())


def test_segments_snapshot_takes_a_day_in_range(world) -> None:
    out = StringIO()
    call_command("segments_snapshot", "--date", date(2026, 11, 28).isoformat(), stdout=out)
    assert "total:" in out.getvalue()


def test_a_json_field_with_an_escaped_nul_is_a_form_error_not_a_500(world, clients) -> None:
    """PostgreSQL's jsonb refuses \\u0000 anywhere: the form says so instead of failing the save."""
    response = clients["manager"].post(
        "/admin/campaigns/campaign/add/",
        _campaign_form(world, name="nul", template_variables='["first_name", "a\\u0000b"]'),
    )
    assert response.status_code == 200
    assert "template_variables" in response.context["adminform"].form.errors
    assert not Campaign.objects.filter(name="nul").exists()


def test_an_emptied_json_field_of_a_not_null_column_saves_its_default(world, clients) -> None:
    """Found by the admin fuzz: an emptied "template variables" box was a NULL and a 500."""
    response = clients["manager"].post(
        "/admin/campaigns/campaign/add/", _campaign_form(world, name="vazio", template_variables="")
    )
    assert response.status_code == 302
    assert Campaign.objects.get(name="vazio").template_variables == []
