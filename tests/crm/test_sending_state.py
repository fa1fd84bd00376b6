"""The sending-state services: pausing an organization's channel or a WhatsApp number, opting customers
out (and back in). One place each; every sender (campaigns, surveys, webhooks, links) calls them."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.utils import timezone

from crm.models import Customer, OptOutSource, Organization
from crm.services import (
    REASON_MAX,
    customers_opt_out,
    customers_opt_out_undo,
    organizations_pause,
    organizations_resume,
)
from integrations.models import WhatsappNumber
from integrations.services import whatsapp_numbers_pause, whatsapp_numbers_resume


def test_a_pause_records_why_cut_to_its_limit_and_logs_it(world, caplog):
    org = world["org"]
    with caplog.at_level(logging.ERROR, logger="crm.services"):
        assert organizations_pause(organization_ids=[org.pk], channel="whatsapp", reason="x" * 3000) == 1
    org.refresh_from_db()
    assert org.whatsapp_paused_at is not None
    assert org.whatsapp_paused_reason == "x" * REASON_MAX
    assert org.email_paused_at is None  # the other channel goes on
    [record] = caplog.records
    assert record.getMessage().startswith(f"organization {org.pk}: WhatsApp sending paused: xxx")


def test_a_second_pause_keeps_the_first_one_s_time_and_reason(world, caplog):
    org = world["org"]
    organizations_pause(organization_ids=[org.pk], channel="email", reason="535 login refused")
    first = Organization.objects.get(pk=org.pk).email_paused_at
    caplog.clear()
    assert organizations_pause(organization_ids=[org.pk], channel="email", reason="another") == 0
    org.refresh_from_db()
    assert (org.email_paused_at, org.email_paused_reason) == (first, "535 login refused")
    assert not [r for r in caplog.records if r.name == "crm.services"]  # nothing paused, nothing logged


def test_resuming_clears_the_pause_of_that_channel_only(world):
    org = world["org"]
    organizations_pause(organization_ids=[org.pk], channel="email", reason="tls")
    organizations_pause(organization_ids=[org.pk], channel="whatsapp", reason="locked")
    assert organizations_resume(organization_ids=[org.pk], channel="email") == 1
    assert organizations_resume(organization_ids=[org.pk], channel="email") == 0
    org.refresh_from_db()
    assert (org.email_paused_at, org.email_paused_reason) == (None, "")
    assert org.whatsapp_paused_reason == "locked"


def test_an_opt_out_records_its_source_and_touches_updated_at_once(world):
    ana, bruno, _carla = world["customers"]
    before = timezone.now()
    assert (
        customers_opt_out(customer_ids=[ana.pk, bruno.pk], channel="whatsapp", source=OptOutSource.PROVIDER)
        == 2
    )
    ana.refresh_from_db()
    assert ana.whatsapp_opted_out_at is not None and ana.whatsapp_opted_out_at >= before
    assert ana.whatsapp_opt_out_source == OptOutSource.PROVIDER
    assert ana.updated_at >= before
    assert ana.email_opted_out_at is None
    # Already out: the first choice (its time and source) is kept.
    assert customers_opt_out(customer_ids=[ana.pk], channel="whatsapp", source=OptOutSource.REPLY) == 0
    assert Customer.objects.get(pk=ana.pk).whatsapp_opt_out_source == OptOutSource.PROVIDER


def test_an_opt_out_may_say_when_it_was_chosen(world):
    ana = world["customers"][0]
    when = timezone.now() - timedelta(hours=3)
    customers_opt_out(customer_ids=[ana.pk], channel="email", source=OptOutSource.UNSUBSCRIBE_LINK, at=when)
    ana.refresh_from_db()
    assert ana.email_opted_out_at == when and ana.updated_at > when


def test_an_opt_out_is_undone_only_when_it_came_from_the_sources_given(world):
    ana, bruno, _carla = world["customers"]
    customers_opt_out(customer_ids=[ana.pk], channel="whatsapp", source=OptOutSource.REPLY)
    customers_opt_out(customer_ids=[bruno.pk], channel="whatsapp", source=OptOutSource.UNSUBSCRIBE_LINK)
    undone = customers_opt_out_undo(
        customer_ids=Customer.objects.filter(pk__in=[ana.pk, bruno.pk]).values_list("pk", flat=True),
        channel="whatsapp",
        sources=[OptOutSource.REPLY, OptOutSource.PROVIDER],
    )
    assert undone == 1
    ana.refresh_from_db()
    bruno.refresh_from_db()
    assert (ana.whatsapp_opted_out_at, ana.whatsapp_opt_out_source) == (None, "")
    assert bruno.whatsapp_opt_out_source == OptOutSource.UNSUBSCRIBE_LINK


def test_a_number_is_paused_only_for_its_own_organization_and_keeps_its_first_reason(world):
    org = world["org"]
    other = Organization.objects.create(name="Outra", slug="outra")
    mine = WhatsappNumber.objects.create(
        organization=org, display_phone_number="+5511940000001", phone_number_id="1"
    )
    theirs = WhatsappNumber.objects.create(
        organization=other, display_phone_number="+5511940000002", phone_number_id="2"
    )
    paused = whatsapp_numbers_pause(
        organization_id=org.pk, number_ids=[mine.pk, theirs.pk], reason="[190] token"
    )
    assert paused == 1
    assert whatsapp_numbers_pause(organization_id=org.pk, number_ids=[mine.pk], reason="later") == 0
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.paused_reason == "[190] token" and mine.paused_at is not None
    assert theirs.paused_at is None
    assert whatsapp_numbers_resume(numbers=WhatsappNumber.objects.filter(pk=mine.pk)) == 1
