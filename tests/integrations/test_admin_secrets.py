"""Secrets in the admin: write-only, stored encrypted, kept when the field is left empty."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from crm.models import Organization
from integrations.models import ChatwootAccount, WhatsappNumber


@pytest.fixture
def staff(client, db):
    user = get_user_model().objects.create_user("ops", password="x-pw-1234", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def test_a_whatsapp_token_is_required_write_only_and_kept_when_left_empty(staff):
    org = Organization.objects.create(name="Loja", slug="loja")
    form = {
        "organization": org.pk,
        "display_phone_number": "+5511940000000",
        "phone_number_id": "555",
        "business_account_id": "",
        "graph_url": "",
        "messages_per_second": 80,
    }
    page = staff.post("/admin/integrations/whatsappnumber/add/", {**form, "access_token": ""})
    assert page.status_code == 200 and not WhatsappNumber.objects.exists()  # refused: no token yet
    staff.post("/admin/integrations/whatsappnumber/add/", {**form, "access_token": "EAAG-first"})
    number = WhatsappNumber.objects.get()
    assert number.get_access_token() == "EAAG-first" and "EAAG" not in number.access_token_encrypted
    change = f"/admin/integrations/whatsappnumber/{number.pk}/change/"
    assert b"EAAG-first" not in staff.get(change).content
    staff.post(change, {**form, "messages_per_second": 40, "access_token": ""})
    number.refresh_from_db()
    assert (number.messages_per_second, number.get_access_token()) == (40, "EAAG-first")


def test_a_chatwoot_account_is_configured_in_the_admin(staff):
    org = Organization.objects.create(name="Loja", slug="loja")
    staff.post(
        "/admin/integrations/chatwootaccount/add/",
        {
            "organization": org.pk,
            "base_url": "https://chat.example.com.br",
            "account_id": 1,
            "inbox_id": 7,
            "mode": "api_inbox",
            "enabled": "on",
            "api_token": "cw-token",
        },
    )
    account = ChatwootAccount.objects.get()
    assert account.get_api_token() == "cw-token" and account.inbox_id == 7
