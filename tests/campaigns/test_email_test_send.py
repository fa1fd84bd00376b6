"""The email campaign's "send this campaign to me": rendered with a chosen customer's variables and
handed to the organization's mail server (the loopback SMTP sandbox) once, before the start; never
a campaign message, and the customer receives nothing."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import Client

from campaigns.models import EmailMessage, TestSend
from crm.models import Membership
from tests.campaigns.test_email_campaign import em, smtp  # noqa: F401  (the email world's fixtures)


def test_a_manager_sends_the_email_campaign_to_their_own_address(em, smtp, run_jobs):  # noqa: F811
    people = em["customers"](2)
    campaign = em["campaign"]()
    user = get_user_model().objects.create_user(
        "gerente", password="pw-gerente-1234", email="gerente@loja.example.com.br", is_staff=True
    )
    Membership.objects.create(user=user, organization=em["org"], role=Membership.Role.MANAGER)
    client = Client(HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(user)
    page = client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert 'id="test-send"' in page and 'value="gerente@loja.example.com.br"' in page
    refused = client.post(
        f"/admin/campaigns/campaign/{campaign.pk}/test-send/",
        {"to": "not-an-address", "customer": people[1].pk},
        follow=True,
    )
    assert "is not an email address" in refused.content.decode()
    client.post(
        f"/admin/campaigns/campaign/{campaign.pk}/test-send/",
        {"to": "gerente@loja.example.com.br", "customer": people[1].pk},
    )
    run_jobs()
    test = TestSend.objects.get(campaign=campaign)
    assert test.status == TestSend.Status.SENT, test.error
    received = smtp.messages()
    assert [m["rcpt_tos"] for m in received] == [["gerente@loja.example.com.br"]]
    assert received[0]["subject"] == "Cliente1, a Black Friday chegou"  # the chosen customer's variables
    assert not EmailMessage.objects.filter(campaign=campaign).exists()
