"""The organization's contact caps across WhatsApp and email (campaigns.caps), through the real
stack: fan-out, send jobs on a burst worker, Meta's sandbox and a loopback SMTP server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.utils import timezone

from campaigns import caps, lifecycle
from campaigns.models import BodyFormat, Campaign, CampaignMetric, Channel, EmailMessage, WhatsappMessage
from crm.models import Organization
from integrations.email import pool
from integrations.models import EmailSettings
from project.sandboxes.smtp import SmtpSandbox

S = WhatsappMessage.Status
Scope = Organization.ContactCapsScope


@pytest.fixture
def smtp() -> Iterator[SmtpSandbox]:
    with SmtpSandbox() as server:
        yield server
    pool.close_all()


@pytest.fixture
def both(wa, smtp, settings) -> dict:
    """The WhatsApp world of `wa`, whose organization also sends email to the SMTP sandbox."""
    settings.EMAIL_BATCH_SIZE = 50
    settings.PUBLIC_URL = "https://crm.example.com.br"
    EmailSettings.objects.create(
        organization=wa["org"],
        host=smtp.address[0],
        port=smtp.address[1],
        security=EmailSettings.Security.NONE,
        sender_name="Loja Teste",
        sender_email="ofertas@loja.example.com.br",
        messages_per_minute=0,
    )

    def email_campaign(**fields) -> Campaign:
        return Campaign.objects.create(
            organization=wa["org"],
            name=fields.pop("name", "Newsletter"),
            channel=Channel.EMAIL,
            email_subject="Ofertas",
            email_body_format=BodyFormat.HTML,
            email_body="<p>Olá {{ first_name }}</p>",
            **fields,
        )

    return {**wa, "email_campaign": email_campaign, "smtp": smtp}


def _caps(org: Organization, *, count: int = 10, block: bool = False, scope: str = Scope.SHARED) -> None:
    org.message_limit_count, org.message_limit_days = count, 7
    org.block_multiple_campaigns, org.contact_caps_scope = block, scope
    org.save()


def _reasons(campaign: Campaign) -> dict[int, tuple[str, str]]:
    return {
        customer: (status, reason)
        for customer, status, reason in campaign.message_model.objects.filter(campaign=campaign).values_list(
            "customer_id", "status", "error_reason"
        )
    }


def test_an_email_after_a_whatsapp_message_within_the_window_is_skipped_with_the_reason(both, run_jobs):
    people = both["customers"](3)
    _caps(both["org"], count=1)
    whatsapp = lifecycle.campaign_start(campaign=both["campaign"]())
    run_jobs()
    assert set(WhatsappMessage.objects.filter(campaign=whatsapp).values_list("status", flat=True)) == {S.SENT}

    email = lifecycle.campaign_start(campaign=both["email_campaign"]())
    run_jobs()
    reason = "message limit: 1 WhatsApp and email messages in the last 7 days (at most 1)"
    assert _reasons(email) == {p.pk: (S.SKIPPED, reason) for p in people}
    assert both["smtp"].messages() == []
    metric = CampaignMetric.objects.get(campaign=email)
    assert (metric.queued, metric.skipped, metric.sent) == (3, 3, 0)
    email.refresh_from_db()
    assert email.status == Campaign.Status.SENT


def test_per_channel_caps_let_the_email_through(both, run_jobs):
    people = both["customers"](3)
    _caps(both["org"], count=1, block=True, scope=Scope.PER_CHANNEL)
    lifecycle.campaign_start(campaign=both["campaign"]())
    run_jobs()
    email = lifecycle.campaign_start(campaign=both["email_campaign"]())
    run_jobs()
    assert _reasons(email) == {p.pk: (S.SENT, "") for p in people}
    assert len(both["smtp"].messages()) == 3
    # …while a second WhatsApp campaign is still capped on its own channel
    again = lifecycle.campaign_start(campaign=both["campaign"](name="Again"))
    run_jobs()
    assert {status for status, _ in _reasons(again).values()} == {S.SKIPPED}


def test_block_multiple_campaigns_counts_the_other_channel(both, run_jobs):
    reached, untouched = both["customers"](2)
    _caps(both["org"], block=True)
    untouched.phone = ""  # not in the WhatsApp audience
    untouched.save(update_fields=["phone"])
    lifecycle.campaign_start(campaign=both["campaign"]())
    run_jobs()
    email = lifecycle.campaign_start(campaign=both["email_campaign"]())
    run_jobs()
    assert _reasons(email) == {reached.pk: (S.SKIPPED, caps.SENT_WITHIN_24H), untouched.pk: (S.SENT, "")}
    assert [m["rcpt_tos"] for m in both["smtp"].messages()] == [[untouched.email]]


def test_an_email_campaign_started_first_wins_over_a_whatsapp_one(both, run_jobs):
    (person,) = both["customers"](1)
    _caps(both["org"], block=True)
    email = lifecycle.campaign_start(campaign=both["email_campaign"]())
    whatsapp = lifecycle.campaign_start(campaign=both["campaign"]())
    run_jobs()
    assert _reasons(email) == {person.pk: (S.SENT, "")}
    assert _reasons(whatsapp) == {person.pk: (S.SKIPPED, caps.QUEUED_EARLIER)}


@pytest.mark.parametrize("status", [Campaign.Status.SENT, Campaign.Status.CANCELLED, Campaign.Status.DRAFT])
def test_a_queued_message_blocks_only_while_its_earlier_campaign_may_still_send_it(both, run_jobs, status):
    waiting, elsewhere = both["customers"](2)
    _caps(both["org"], block=True)
    earlier = both["campaign"](name="Earlier", status=Campaign.Status.SENDING, started_at=timezone.now())
    for customer in (waiting, elsewhere):
        WhatsappMessage.objects.create(
            campaign=earlier, organization=both["org"], customer=customer, status=S.QUEUED
        )
    # A campaign that ended (or never started) with a message left queued never sends it: no block.
    ended = both["campaign"](name="Ended", status=status, started_at=timezone.now())
    WhatsappMessage.objects.filter(campaign=earlier, customer=elsewhere).update(campaign=ended)
    later = caps.skip_reasons(
        campaign=both["campaign"](name="Later", status=Campaign.Status.SENDING, started_at=timezone.now()),
        customer_ids=[waiting.pk, elsewhere.pk],
        now=timezone.now(),
    )
    assert later == {waiting.pk: caps.QUEUED_EARLIER}


def test_a_send_batch_applies_the_caps_again_to_what_was_sent_since_the_fanout(both, run_jobs):
    """The fan-out queued the email; a WhatsApp message reached the customer before its batch ran."""
    (person,) = both["customers"](1)
    _caps(both["org"], count=1)
    email = lifecycle.campaign_start(campaign=both["email_campaign"]())
    run_jobs(["campaign-trigger"])
    assert _reasons(email) == {person.pk: (S.QUEUED, "")}
    other = both["campaign"](name="Elsewhere", status=Campaign.Status.SENT)
    WhatsappMessage.objects.create(
        campaign=other, organization=both["org"], customer=person, status=S.DELIVERED, sent_at=timezone.now()
    )
    run_jobs()
    assert _reasons(email)[person.pk][0] == EmailMessage.Status.SKIPPED
    assert "message limit: 1" in _reasons(email)[person.pk][1]
    assert both["smtp"].messages() == []
