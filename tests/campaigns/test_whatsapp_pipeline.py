"""Pipelined pacing: a paced number's next chunk is claimed and booked while the one before is in
flight, so its schedule never waits for a chunk's answers; never above the number's tier."""

from __future__ import annotations

from datetime import datetime

import pytest

from campaigns import fanout, lifecycle
from campaigns.models import Campaign, WhatsappMessage
from campaigns.whatsapp import sending
from crm import jobs
from integrations.models import WhatsappNumber

S = WhatsappMessage.Status
RATE = 10  # the number's tier, messages per second
CHUNK = 5  # a chunk's slots last half a second
LATENCY_MS = 1000  # Meta's answers take twice as long as a chunk's slots


def _paced_campaign(wa, settings, *, people: int, pipeline: bool) -> Campaign:
    settings.WHATSAPP_BATCH_SIZE = people  # one batch
    settings.WHATSAPP_SEND_CHUNK = CHUNK
    settings.WHATSAPP_SEND_PIPELINE = pipeline
    WhatsappNumber.objects.filter(pk=wa["number"].pk).update(messages_per_second=RATE)
    wa["customers"](people)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    fanout.campaign_fanout(campaign_id=campaign.pk)
    assert set(WhatsappMessage.objects.filter(campaign=campaign).values_list("batch", flat=True)) == {0}
    return campaign


def _most_in_one_second(received: list[dict]) -> int:
    """The most answers the sandbox gave within any one second (every send answered LATENCY_MS after
    it arrived, so the windows of arrivals hold as many)."""
    at = sorted(datetime.fromisoformat(m["received_at"]).timestamp() for m in received)
    return max(sum(1 for t in at[i:] if t - start < 1.0) for i, start in enumerate(at))


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_paced_job_books_the_next_chunk_while_its_answers_are_outstanding(wa, sandbox, settings, pipeline):
    campaign = _paced_campaign(wa, settings, people=4 * CHUNK, pipeline=pipeline)
    sandbox.configure(latency_ms=LATENCY_MS)

    counts = sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=0)

    rows = WhatsappMessage.objects.filter(campaign=campaign)
    assert counts["sent"] == 4 * CHUNK
    assert set(rows.values_list("status", flat=True)) == {S.SENT}
    stats = sandbox.stats()
    assert stats["by_recipient_max"] == 1
    if pipeline:
        # The next chunk's sends reached Meta while the chunk before still waited for its answers.
        assert stats["in_flight_max"] > CHUNK
    else:  # each chunk claimed once the one before is written: one chunk in flight at a time
        assert stats["in_flight_max"] <= CHUNK
    # Never above the tier: one slot a message, RATE a second, whichever chunk booked it.
    assert _most_in_one_second(sandbox.messages()) <= RATE + 1
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT


def test_a_fast_numbers_chunk_holds_a_quarter_second_of_its_rate(wa, sandbox, settings):
    # At 20/s with WHATSAPP_SEND_CHUNK_SECONDS 0.5 a chunk is 10 messages, not WHATSAPP_SEND_CHUNK's 5:
    # with the pipeline off, one chunk in flight at a time, all of it within Meta's latency.
    campaign = _paced_campaign(wa, settings, people=4 * CHUNK, pipeline=False)
    settings.WHATSAPP_SEND_CHUNK_SECONDS = 0.5
    WhatsappNumber.objects.filter(pk=wa["number"].pk).update(messages_per_second=2 * RATE)
    sandbox.configure(latency_ms=LATENCY_MS)

    counts = sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=0)

    assert counts["sent"] == 4 * CHUNK
    assert sandbox.stats()["in_flight_max"] == 2 * CHUNK
    assert _most_in_one_second(sandbox.messages()) <= 2 * RATE + 1


def test_an_unpaced_job_keeps_up_to_max_in_flight_messages_in_flight_in_small_chunks(wa, sandbox, settings):
    # Two chunks in flight held an unpaced worker to 0.5x a raw loop at 200 ms: the pipe holds
    # WHATSAPP_MAX_IN_FLIGHT messages in chunks (each a turn other work may take), never more.
    campaign = _paced_campaign(wa, settings, people=8 * CHUNK, pipeline=True)
    WhatsappNumber.objects.filter(pk=wa["number"].pk).update(messages_per_second=0)
    settings.WHATSAPP_MAX_IN_FLIGHT = 4 * CHUNK
    sandbox.configure(latency_ms=LATENCY_MS)

    counts = sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=0)

    assert counts["sent"] == 8 * CHUNK
    assert sandbox.stats()["by_recipient_max"] == 1
    assert 2 * CHUNK < sandbox.stats()["in_flight_max"] <= 4 * CHUNK


def test_a_failure_claiming_a_chunk_lands_every_chunk_in_flight_before_it_is_raised(
    wa, sandbox, settings, monkeypatch
):
    campaign = _paced_campaign(wa, settings, people=8 * CHUNK, pipeline=True)
    WhatsappNumber.objects.filter(pk=wa["number"].pk).update(messages_per_second=0)
    settings.WHATSAPP_MAX_IN_FLIGHT = 4 * CHUNK
    sandbox.configure(latency_ms=LATENCY_MS)
    prepare, calls = sending._prepare, []

    def failing_third(lane, *, within):  # e.g. the number's token cannot be decrypted any more
        calls.append(lane)
        if len(calls) == 3:
            raise RuntimeError("credentials unreadable")
        prepare(lane, within=within)

    monkeypatch.setattr(sending, "_prepare", failing_third)
    with pytest.raises(RuntimeError, match="credentials unreadable"):
        sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=0)

    rows = WhatsappMessage.objects.filter(campaign=campaign)
    # The two chunks Meta had are written as sent; the rest waits, no attempt spent on the third.
    assert rows.filter(status=S.SENT).count() == 2 * CHUNK == len(sandbox.messages())
    assert rows.filter(status=S.QUEUED).count() == 6 * CHUNK
    assert not rows.filter(status=S.QUEUED, attempts__gt=1).exists()


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_job_gives_its_turn_only_after_a_full_chunk_with_more_to_send(
    wa, sandbox, settings, monkeypatch, pipeline
):
    campaign = _paced_campaign(wa, settings, people=CHUNK + 2, pipeline=pipeline)
    WhatsappNumber.objects.filter(pk=wa["number"].pk).update(messages_per_second=0)
    monkeypatch.setattr(jobs, "turn_waits", lambda: True)  # another tenant's work always waits

    with pytest.raises(jobs.Yield):
        sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=0)
    assert len(sandbox.messages()) == CHUNK
    # The rest is a short chunk: sent, and the batch done, without giving a turn for nothing.
    counts = sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=0)
    assert counts["sent"] == 2
    assert len(sandbox.messages()) == CHUNK + 2


def test_a_paced_job_books_no_more_than_two_chunks_of_its_schedule_ahead(wa, sandbox, settings, monkeypatch):
    # Unpaced, the pipe holds WHATSAPP_MAX_IN_FLIGHT messages; paced, more than two chunks would
    # book the number's schedule seconds ahead, and a job giving its turn waits for all of it.
    campaign = _paced_campaign(wa, settings, people=6 * CHUNK, pipeline=True)
    land, claimed = sending._land, []

    def counting(*args, **kwargs):
        claimed.append(WhatsappMessage.objects.filter(campaign=campaign, status=S.SENDING).count())
        return land(*args, **kwargs)

    monkeypatch.setattr(sending, "_land", counting)
    counts = sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=0)

    assert counts["sent"] == 6 * CHUNK
    assert max(claimed) == 2 * CHUNK


def test_a_job_reads_the_rate_card_once_not_for_every_chunk(wa, sandbox, settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    campaign = _paced_campaign(wa, settings, people=4 * CHUNK, pipeline=True)
    WhatsappNumber.objects.filter(pk=wa["number"].pk).update(messages_per_second=0)
    with CaptureQueriesContext(connection) as queries:
        counts = sending.whatsapp_send_batch(campaign_id=campaign.pk, batch=0)

    assert counts["sent"] == 4 * CHUNK
    prices = [q for q in queries.captured_queries if "whatsappprice" in q["sql"]]
    metrics = [
        q
        for q in queries.captured_queries
        if q["sql"].startswith('SELECT "campaigns_campaignmetric"."cost_currency"')
    ]
    assert len(prices) == 1 and len(metrics) == 1  # four chunks: four and eight before


def test_the_chunks_whose_answers_are_all_in_are_written_with_the_oldest():
    import concurrent.futures
    from collections import deque

    def flight(done: bool) -> sending._Flight:
        sends: concurrent.futures.Future = concurrent.futures.Future()
        if done:
            sends.set_result([])
        return sending._Flight(CHUNK, 0, [], {}, [], None, sends)

    oldest, answered, pending, after = flight(True), flight(True), flight(False), flight(True)
    flights = deque([oldest, answered, pending, after])
    assert sending._landing(flights) == [oldest, answered]  # in order: not past one still waiting
    assert list(flights) == [pending, after]
