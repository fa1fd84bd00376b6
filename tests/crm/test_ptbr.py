"""pt-BR admin messages agree in gender: "A campanha “Natal” foi adicionada com sucesso."."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import translation

from campaigns.models import Campaign
from crm.models import Membership, Organization
from crm.ptbr import gender_agree


def test_a_feminine_model_name_gets_a_feminine_article_and_participle():
    with translation.override("pt-br"):
        assert gender_agree("O campanha “Natal” foi adicionado com sucesso.", "campanha") == (
            "A campanha “Natal” foi adicionada com sucesso."
        )
        assert (
            gender_agree(
                "O campanha “Natal” foi adicionado com sucesso. Você pode editá-lo novamente abaixo.",
                "campanha",
            )
            == "A campanha “Natal” foi adicionada com sucesso. Você pode editá-la novamente abaixo."
        )
        assert (
            gender_agree(
                "O  loja “Centro” foi alterado com sucesso. Você talvez adicione outro loja abaixo.", "loja"
            )
            == "A loja “Centro” foi alterada com sucesso. Você talvez adicione outra loja abaixo."
        )
        assert gender_agree("O cliente “Ana” foi alterado com sucesso.", "cliente") == (
            "O cliente “Ana” foi alterado com sucesso."
        )
    with translation.override("en"):
        assert gender_agree("The campaign “Natal” was added successfully.", "campaign").startswith("The ")


def _manager() -> tuple[Organization, Client]:
    """An organization and its manager's browser, in Portuguese."""
    org = Organization.objects.create(name="Loja", slug="loja")
    user = get_user_model().objects.create_user("gerente", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=user, organization=org, role=Membership.Role.MANAGER)
    client = Client(HTTP_ACCEPT_LANGUAGE="pt-br")
    client.force_login(user)
    return org, client


def test_adding_a_campaign_in_portuguese_says_foi_adicionada(db):
    org, client = _manager()
    page = client.post(
        "/admin/campaigns/campaign/add/",
        {
            "organization": org.pk,
            "name": "Natal",
            "channel": "email",
            "email_body_format": "html",
            "sender": "campaign",
            "recurrence_misfire": "once",
            "template_language": "pt_BR",
            "template_category": "marketing",
        },
        follow=True,
    )
    assert Campaign.objects.filter(name="Natal").exists(), page.content.decode()[:3000]
    html = page.content.decode()
    assert re.search(r"A campanha “<a [^>]*>Natal</a>” foi adicionada com sucesso", html), html[:2000]


def test_the_404_and_403_pages_speak_the_visitors_language(db):
    client = Client(HTTP_ACCEPT_LANGUAGE="pt-br")
    page = client.get("/nada-aqui/")
    assert page.status_code == 404 and "Página não encontrada" in page.content.decode()
    english = Client(HTTP_ACCEPT_LANGUAGE="en").get("/nothing-here/")
    assert english.status_code == 404 and "Page not found" in english.content.decode()


def test_a_status_agrees_with_what_it_describes():
    """ "o modelo" (a WhatsApp template) is pausado, "a campanha" pausada: one msgid, two genders."""
    from integrations.models import WhatsappTemplate

    with translation.override("pt-br"):
        assert [str(s.label) for s in (WhatsappTemplate.Status.APPROVED, WhatsappTemplate.Status.PAUSED)] == [
            "aprovado",
            "pausado",
        ]
        assert str(Campaign.Status.PAUSED.label) == "pausada"


def test_a_providers_and_a_flows_words_are_labels():
    """Meta's template categories (MARKETING, UTILITY), the rate card's, a flow's trigger and step
    types are shown as words of the reader's language, and a value Meta adds later as it came."""
    from flows.models import EnrollmentStep, Flow
    from integrations.models import WhatsappPrice, WhatsappTemplate

    with translation.override("pt-br"):
        assert WhatsappTemplate(category="UTILITY").get_category_display() == "utilidade"
        assert WhatsappTemplate(category="AUTHENTICATION").get_category_display() == "autenticação"
        assert WhatsappTemplate(category="NEW_ONE").get_category_display() == "NEW_ONE"
        assert WhatsappPrice(category="utility").get_category_display() == "utilidade"
        assert Flow(trigger_type="no_purchase").get_trigger_type_display() == "sem compra"
        assert EnrollmentStep(type="send_whatsapp").get_type_display() == "enviar uma mensagem de WhatsApp"


def test_the_delete_action_of_a_feminine_list_agrees(db):
    """'Remover conexões com o ERP selecionadas', not '… selecionados' (seen on a fresh make run)."""
    org, client = _manager()
    campaign = Campaign.objects.create(organization=org, name="Natal")
    html = client.get("/admin/campaigns/campaign/").content.decode()
    assert "Remover campanhas selecionadas" in html and "campanhas selecionados" not in html
    assert "Remover clientes selecionados" in client.get("/admin/crm/customer/").content.decode()
    assert campaign.pk


def test_a_duplicate_is_refused_in_words_that_agree_whatever_the_fields_gender(db):
    from django.core.exceptions import ValidationError

    from crm.models import Store

    org = Organization.objects.create(name="Dup", slug="dup")
    Store.objects.create(organization=org, erp_code="001", name="Centro")
    with translation.override("pt-br"), pytest.raises(ValidationError) as refused:
        Store(organization=org, erp_code="001", name="Outra").validate_constraints()
    text = " ".join(refused.value.messages)
    assert "com este Organização" not in text  # Django's own pt-BR
    assert text.startswith("Já existe Loja com estes valores de Organização e ")
