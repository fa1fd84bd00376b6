"""The campaign fan-out (COPY, one transaction per page of the audience) run again after a crash:
every recipient gets one message, the ones written before keep their batch, the counters and the
send jobs match what is in the database."""

from __future__ import annotations

import pytest
from django.db.models import Count

from campaigns import services
from campaigns.models import Campaign, CampaignMetric, EmailMessage, WhatsappMessage
from crm import jobs
from crm.models import JobRun


class Crash(Exception):
    pass


def _crash_after(monkeypatch: pytest.MonkeyPatch, pages: int) -> None:
    """The worker dies after committing `pages` pages of messages."""
    write = services._fanout_page
    written: list[int] = []

    def page_then_crash(*args, **kwargs):
        if len(written) == pages:
            raise Crash
        written.append(1)
        return write(*args, **kwargs)

    monkeypatch.setattr(services, "_fanout_page", page_then_crash)


def _batches(campaign: Campaign) -> dict[int, int]:
    return dict(WhatsappMessage.objects.filter(campaign=campaign).values_list("customer_id", "batch"))


def test_a_fan_out_run_again_after_a_crash_writes_each_message_once(wa, run_jobs, settings, monkeypatch):
    settings.WHATSAPP_BATCH_SIZE = 100
    people = wa["customers"](2500)
    late = people[500]  # joins the audience between the two runs, inside a page already written
    late.marketing_consent = False
    late.save(update_fields=["marketing_consent"])
    campaign = services.campaign_start(campaign=wa["campaign"]())

    _crash_after(monkeypatch, pages=2)
    with pytest.raises(Crash):
        services.campaign_fanout(campaign_id=campaign.pk, chunk=1000)
    monkeypatch.undo()
    first = _batches(campaign)
    assert len(first) == 2000  # two pages committed, the third never started
    assert CampaignMetric.objects.get(campaign=campaign).queued == 0  # counted at the end only
    assert jobs.get_connection().llen("rq:queue:whatsapp-send") == 0  # and enqueued at the end only

    late.marketing_consent = True
    late.save(update_fields=["marketing_consent"])
    run_jobs(["campaign-trigger"])  # the fan-out job itself, as a retry or `recover` runs it

    assert JobRun.objects.get(kind="campaign-fanout", key=str(campaign.pk)).status == "completed"
    messages = WhatsappMessage.objects.filter(campaign=campaign)
    assert messages.count() == 2500
    assert not messages.values("customer_id").annotate(n=Count("id")).filter(n__gt=1).exists()
    queued = messages.filter(status="queued").values_list("customer_id", flat=True)
    assert set(queued) == {p.pk for p in people}
    again = _batches(campaign)
    assert {c: again[c] for c in first} == first  # written before: batch kept
    audience = [p.pk for p in people]  # ascending pk, late included
    for position, customer_id in enumerate(audience):
        if customer_id not in first:
            assert again[customer_id] == position // 100, customer_id
    batches = set(again.values())
    assert CampaignMetric.objects.get(campaign=campaign).queued == 2500
    assert jobs.get_connection().llen("rq:queue:whatsapp-send") == len(batches)

    # and once more: nothing written, nothing enqueued twice
    assert services.campaign_fanout(campaign_id=campaign.pk, chunk=700) == 2500
    assert _batches(campaign) == again
    assert CampaignMetric.objects.get(campaign=campaign).queued == 2500
    assert jobs.get_connection().llen("rq:queue:whatsapp-send") == len(batches)


def test_an_email_fan_out_writes_one_message_per_recipient_in_batches(wa, settings):
    settings.EMAIL_BATCH_SIZE = 40
    wa["customers"](250)
    campaign = wa["campaign"](channel="email", status=Campaign.Status.SENDING)
    CampaignMetric.objects.create(campaign=campaign)
    assert services.campaign_fanout(campaign_id=campaign.pk, chunk=100) == 250
    assert services.campaign_fanout(campaign_id=campaign.pk, chunk=100) == 250
    mail = EmailMessage.objects.filter(campaign=campaign)
    assert mail.count() == 250 and mail.values("customer_id").distinct().count() == 250
    assert sorted(mail.values_list("batch", flat=True).distinct()) == list(range(7))  # 250 / 40
    assert {m.status for m in mail} == {"queued"} and len({m.token for m in mail}) == 250
    assert jobs.get_connection().llen("rq:queue:email-send") == 7
    assert not WhatsappMessage.objects.filter(campaign=campaign).exists()
