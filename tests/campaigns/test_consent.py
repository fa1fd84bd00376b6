"""Consent is recorded, never assumed: a customer who arrives without one is never messaged, the
campaign page counts them as "no consent" before the start, and a consent withdrawn after the
fan-out skips the message with that reason. Sent for real through the Meta sandbox and RQ workers."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import translation

from campaigns import lifecycle, selectors
from campaigns.caps import NO_CONSENT
from campaigns.models import WhatsappMessage
from crm.models import ConsentChange, ConsentSource, Customer, Membership
from crm.services import customers_consent_set


def _manager(org) -> tuple[Client, object]:
    user = get_user_model().objects.create_user("gerente", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=user, organization=org, role=Membership.Role.MANAGER)
    client = Client()
    client.force_login(user)
    return client, user


def test_a_customer_created_without_a_consent_has_none_and_is_counted_as_such(wa):
    wa["customers"](3)  # consenting (a form gave it, in the fixture)
    org = wa["org"]
    for i in range(2):  # arrived without one: the admin, an import, any other path
        Customer.objects.create(organization=org, name=f"Sem {i}", phone=f"+551197000000{i}")
    assert Customer.objects.filter(organization=org, marketing_consent=False).count() == 2
    campaign = wa["campaign"]()
    counts = selectors.campaign_audience_counts(campaign=campaign)
    assert (counts["receives"], counts["no_consent"], counts["opted_out"], counts["no_contact"]) == (
        3,
        2,
        0,
        0,
    )
    client, _user = _manager(org)
    with translation.override("pt-br"):
        page = client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/", HTTP_ACCEPT_LANGUAGE="pt-br")
    assert page.status_code == 200
    assert '<th>sem consentimento</th><td data-skip="no_consent">2</td>' in page.content.decode()


def test_a_manager_records_consent_with_who_and_when_and_cannot_type_it(wa):
    org = wa["org"]
    customer = Customer.objects.create(organization=org, name="Ana", phone="+5511970000001")
    client, user = _manager(org)
    # The form ignores a typed consent: it is read-only.
    form = client.get(f"/admin/crm/customer/{customer.pk}/change/")
    assert b'name="marketing_consent"' not in form.content
    client.post("/admin/crm/customer/", {"action": "consent_record", "_selected_action": [customer.pk]})
    customer.refresh_from_db()
    assert (customer.marketing_consent, customer.marketing_consent_source) == (True, ConsentSource.ADMIN)
    assert customer.marketing_consent_by_id == user.pk and customer.consent_at is not None
    change = ConsentChange.objects.get(customer=customer)
    assert (change.given, change.source, change.by_id) == (True, ConsentSource.ADMIN, user.pk)
    client.post("/admin/crm/customer/", {"action": "consent_withdraw", "_selected_action": [customer.pk]})
    customer.refresh_from_db()
    assert customer.marketing_consent is False and customer.consent_at is None
    assert ConsentChange.objects.filter(customer=customer).count() == 2


def test_a_consent_withdrawn_after_the_fan_out_skips_the_message_as_no_consent(wa, sandbox, run_jobs):
    people = wa["customers"](3)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs(["campaign-trigger"])  # the fan-out: three messages queued
    assert WhatsappMessage.objects.filter(campaign=campaign).count() == 3
    customers_consent_set(customer_ids=[people[0].pk], given=False, source=ConsentSource.ADMIN)
    run_jobs()
    skipped = WhatsappMessage.objects.get(campaign=campaign, customer=people[0])
    assert (skipped.status, skipped.error_reason) == (WhatsappMessage.Status.SKIPPED, NO_CONSENT)
    assert {m["to"] for m in sandbox.messages()} == {p.phone.lstrip("+") for p in people[1:]}
