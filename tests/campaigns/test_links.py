"""Signed redirect and unsubscribe links, through the real URLconf, middleware and templates."""

from __future__ import annotations

import re
import secrets
import string
from datetime import timedelta

import pytest
from django.core import signing
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from campaigns import links
from campaigns.models import Campaign, CampaignMetric, EmailMessage, WhatsappMessage
from campaigns.selectors import campaign_audience
from crm.models import Customer, OptOutSource

TARGET = "https://loja.example.com.br/bf"


@pytest.fixture
def campaign(world) -> Campaign:
    campaign = Campaign.objects.create(
        organization=world["org"],
        name="Black Friday",
        template_name="promo_bf",
        redirect_url=TARGET,
        redirect_button_index=0,
        unsubscribe_button_index=1,
        status=Campaign.Status.SENT,
    )
    CampaignMetric.objects.create(campaign=campaign, queued=2, sent=2)
    return campaign


@pytest.fixture
def messages(world, campaign) -> list[WhatsappMessage]:
    return [
        WhatsappMessage.objects.create(
            campaign=campaign,
            organization=world["org"],
            customer=customer,
            status=WhatsappMessage.Status.DELIVERED,
            phone=customer.phone,
        )
        for customer in world["customers"][:2]
    ]


def _url(kind: str, message: WhatsappMessage) -> str:
    return "/" + links.link_path(kind, message)


def _clicked(campaign: Campaign) -> int:
    return CampaignMetric.objects.get(campaign=campaign).clicked


def test_a_link_names_its_message_and_fits_a_whatsapp_button(messages, django_assert_num_queries):
    message = messages[0]
    path = links.link_path("r", message)
    assert path.startswith("r/") and links.link_path("u", message).startswith("u/")
    assert len(path) < 70
    assert re.fullmatch(r"[ru]/[A-Za-z0-9_\-.]+", path)  # nothing a URL would need to escape
    assert message.token not in links.link_token("r", messages[1])
    with django_assert_num_queries(1):
        found = links.message_for("r", links.link_token("r", message))
        assert found is not None
        assert (found.pk, found.campaign.redirect_url, found.customer.pk) == (
            message.pk,
            TARGET,
            message.customer_id,
        )
    with pytest.raises(ValueError, match="unknown link kind"):
        links.link_path("x", message)


def test_a_made_up_link_is_a_404_without_a_database_query(messages, django_assert_num_queries):
    client = Client()
    made_up = f"{secrets.token_urlsafe(16)}.{secrets.token_urlsafe(32)}"
    with django_assert_num_queries(0):
        for url in (f"/r/{made_up}", f"/u/{made_up}", f"/r/{messages[0].token}", "/u/x"):
            response = client.get(url)
            assert response.status_code == 404
            assert "Link inválido" in response.content.decode()
        response = client.post(f"/u/{made_up}")
        assert response.status_code == 404


def test_a_tampered_link_or_one_signed_for_another_purpose_is_rejected(messages, django_assert_num_queries):
    client = Client()
    signed = links.link_token("r", messages[0])
    token, signature = signed.split(".")
    other = messages[1].token
    forged = [
        f"{other}.{signature}",  # another message's token with this signature
        f"{token}.{signature[:-1]}{'A' if signature[-1] != 'A' else 'B'}",
        signing.Signer(sep=".").sign(token),  # right key, wrong salt
    ]
    with django_assert_num_queries(0):
        for value in forged:
            assert client.get(f"/r/{value}").status_code == 404
            assert client.post(f"/u/{value}").status_code == 404
    assert WhatsappMessage.objects.filter(clicked_at__isnull=False).count() == 0
    assert Customer.objects.filter(whatsapp_opted_out_at__isnull=False).count() == 0
    assert _clicked(messages[0].campaign) == 0


def test_a_token_signed_for_one_kind_of_link_works_for_no_other(messages, django_assert_num_queries):
    """The open pixel's token (seen by image proxies and whoever the email is forwarded to) must not
    unsubscribe the customer, nor a click link's; each kind signs with its own salt."""
    client = Client()
    message = messages[0]
    with django_assert_num_queries(0):
        for kind in ("o", "r"):
            assert client.post(f"/u/{links.link_token(kind, message)}").status_code == 404
        for kind in ("o", "u"):
            assert client.get(f"/r/{links.link_token(kind, message)}").status_code == 404
    assert Customer.objects.filter(whatsapp_opted_out_at__isnull=False).count() == 0
    assert _clicked(message.campaign) == 0
    assert client.post(f"/u/{links.link_token('u', message)}").status_code == 200
    assert Customer.objects.filter(whatsapp_opted_out_at__isnull=False).count() == 1


def test_a_well_signed_token_of_no_message_is_a_404_that_leaks_nothing(messages):
    ghost = signing.Signer(salt="campaigns.link.r", sep=".").sign(secrets.token_urlsafe(16))
    response = Client().get(f"/r/{ghost}")
    assert response.status_code == 404
    body = response.content.decode()
    assert "Link inválido" in body and ghost not in body and "Traceback" not in body


def test_a_click_redirects_to_the_campaign_url_and_counts_once_per_message(campaign, messages):
    client = Client()
    first = client.get(_url("r", messages[0]))
    assert (first.status_code, first["Location"]) == (302, TARGET)
    clicked_at = WhatsappMessage.objects.get(pk=messages[0].pk).clicked_at
    assert clicked_at is not None
    again = client.get(_url("r", messages[0]))
    assert (again.status_code, again["Location"]) == (302, TARGET)
    assert _clicked(campaign) == 1
    assert WhatsappMessage.objects.get(pk=messages[0].pk).clicked_at == clicked_at
    client.get(_url("r", messages[1]))
    assert _clicked(campaign) == 2
    assert WhatsappMessage.objects.get(pk=messages[1].pk).clicked_at is not None


def test_the_redirect_target_is_never_taken_from_the_request(campaign, messages):
    response = Client().get(
        _url("r", messages[0]) + "?next=https://evil.example.com/&url=https://evil.example.com/",
        HTTP_REFERER="https://evil.example.com/",
    )
    assert (response.status_code, response["Location"]) == (302, TARGET)


def test_a_campaign_without_a_redirect_url_shows_the_invalid_page_and_counts_nothing(campaign, messages):
    Campaign.objects.filter(pk=campaign.pk).update(redirect_url="")
    response = Client().get(_url("r", messages[0]))
    assert response.status_code == 404
    assert _clicked(campaign) == 0


def test_a_link_preview_head_request_is_not_a_click(campaign, messages):
    response = Client().head(_url("r", messages[0]))
    assert response.status_code == 302
    assert _clicked(campaign) == 0
    assert WhatsappMessage.objects.get(pk=messages[0].pk).clicked_at is None


def test_the_unsubscribe_page_asks_in_portuguese_and_changes_nothing(messages):
    response = Client().get(_url("u", messages[0]), HTTP_ACCEPT_LANGUAGE="en-US,en;q=0.9")
    assert response.status_code == 200
    body = response.content.decode()
    assert "Confirmar descadastro" in body and 'method="post"' in body
    assert '<meta name="robots" content="noindex">' in body
    assert 'name="viewport"' in body and 'lang="pt-BR"' in body
    assert response["Content-Language"] == "pt-br"
    assert "no-cache" in response["Cache-Control"] or "no-store" in response["Cache-Control"]
    customer = Customer.objects.get(pk=messages[0].customer_id)
    assert (customer.whatsapp_opted_out_at, customer.whatsapp_opt_out_source) == (None, "")


def test_confirming_opts_the_customer_out_without_cookies_or_a_redirect(messages):
    client = Client(enforce_csrf_checks=True)  # no CSRF cookie or token: the signed link is the credential
    response = client.post(_url("u", messages[0]), HTTP_ACCEPT_LANGUAGE="en")
    assert response.status_code == 200
    body = response.content.decode()
    assert "Você não receberá mais mensagens de marketing" in body
    assert '<meta name="robots" content="noindex">' in body
    customer = Customer.objects.get(pk=messages[0].customer_id)
    assert customer.whatsapp_opted_out_at is not None
    assert customer.whatsapp_opt_out_source == OptOutSource.UNSUBSCRIBE_LINK
    assert customer.email_opted_out_at is None  # a WhatsApp button speaks for WhatsApp only
    other = Customer.objects.get(pk=messages[1].customer_id)
    assert other.whatsapp_opted_out_at is None


def test_confirming_twice_keeps_the_first_opt_out(messages):
    client = Client(enforce_csrf_checks=True)
    url = _url("u", messages[0])
    client.post(url)
    first = Customer.objects.get(pk=messages[0].customer_id).whatsapp_opted_out_at
    second = client.post(url)
    assert second.status_code == 200
    assert "Você não receberá mais mensagens de marketing" in second.content.decode()
    assert Customer.objects.get(pk=messages[0].customer_id).whatsapp_opted_out_at == first
    # opening the link again shows that it is done rather than asking again
    again = client.get(url)
    assert "Você não receberá mais mensagens de marketing" in again.content.decode()
    assert "Confirmar descadastro" not in again.content.decode()


def test_an_earlier_opt_out_keeps_its_time_and_source(messages):
    earlier = timezone.now() - timedelta(days=30)
    Customer.objects.filter(pk=messages[0].customer_id).update(
        whatsapp_opted_out_at=earlier, whatsapp_opt_out_source=OptOutSource.PROVIDER
    )
    response = Client(enforce_csrf_checks=True).post(_url("u", messages[0]))
    assert response.status_code == 200
    customer = Customer.objects.get(pk=messages[0].customer_id)
    assert (customer.whatsapp_opted_out_at, customer.whatsapp_opt_out_source) == (
        earlier,
        OptOutSource.PROVIDER,
    )


def test_a_customer_who_opted_out_by_link_is_left_out_of_the_next_campaign(world, messages):
    opted_out = messages[0].customer
    next_campaign = Campaign.objects.create(organization=world["org"], name="Natal")
    assert opted_out in campaign_audience(campaign=next_campaign)
    Client(enforce_csrf_checks=True).post(_url("u", messages[0]))
    audience = set(campaign_audience(campaign=next_campaign))
    assert opted_out not in audience
    assert messages[1].customer in audience


@given(token=st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=40))
@hsettings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_link_is_what_djangos_signer_makes_and_unsigns(token, settings):
    """link_token derives the signer's salted key once per kind and SECRET_KEY: the same text as
    Signer.sign, which message_for's unsign takes (also after the key is rotated into the fallbacks)."""
    for kind in links.KINDS:
        for message in (WhatsappMessage(token=token), EmailMessage(token=token)):
            signed = links.link_token(kind, message)
            value = signed.rsplit(".", 1)[0]
            assert signed == links._signer(kind).sign(value)
            settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = (
                "another-key-" + "x" * 40,
                [settings.SECRET_KEY],
            )
            assert links._signer(kind).unsign(signed) == value  # the old key still verifies
            assert links.link_token(kind, message) != signed  # new links carry the new key
            settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = settings.SECRET_KEY_FALLBACKS[0], []
