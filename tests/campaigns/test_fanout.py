"""The campaign fan-out (one INSERT ... SELECT and one transaction per page of the audience): run
again after a crash every recipient gets one message, the ones written before keep their batch, the
counters and the send jobs match what is in the database; its tokens, its conflicts, and deletions
while it runs (the message rows have no foreign-key constraints)."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from campaigns import caps, fanout, lifecycle, links, selectors
from campaigns.models import Campaign, CampaignMetric, EmailMessage, WhatsappMessage
from crm import fairshare, jobs
from crm.models import JobRun


class Crash(Exception):
    pass


def _crash_after(monkeypatch: pytest.MonkeyPatch, pages: int) -> None:
    """The worker dies after committing `pages` pages of messages."""
    write = fanout._fanout_page
    written: list[int] = []

    def page_then_crash(*args, **kwargs):
        if len(written) == pages:
            raise Crash
        written.append(1)
        return write(*args, **kwargs)

    monkeypatch.setattr(fanout, "_fanout_page", page_then_crash)


def _batches(campaign: Campaign) -> dict[int, int]:
    return dict(WhatsappMessage.objects.filter(campaign=campaign).values_list("customer_id", "batch"))


def test_a_fan_out_run_again_after_a_crash_writes_each_message_once(wa, run_jobs, settings, monkeypatch):
    settings.WHATSAPP_BATCH_SIZE = 100
    people = wa["customers"](2500)
    late = people[500]  # joins the audience between the two runs, inside a page already written
    late.marketing_consent = False
    late.save(update_fields=["marketing_consent"])
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())

    _crash_after(monkeypatch, pages=2)
    with pytest.raises(Crash):
        fanout.campaign_fanout(campaign_id=campaign.pk, chunk=1000)
    monkeypatch.undo()
    first = _batches(campaign)
    assert len(first) == 2000  # two pages committed, the third never started
    assert CampaignMetric.objects.get(campaign=campaign).queued == 0  # counted at the end only
    assert (
        len(fairshare.queued_ids(jobs.get_connection(), "whatsapp-send")) == 0
    )  # and enqueued at the end only

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
    assert len(fairshare.queued_ids(jobs.get_connection(), "whatsapp-send")) == len(batches)

    # and once more: nothing written, nothing enqueued twice
    assert fanout.campaign_fanout(campaign_id=campaign.pk, chunk=700) == 2500
    assert _batches(campaign) == again
    assert CampaignMetric.objects.get(campaign=campaign).queued == 2500
    assert len(fairshare.queued_ids(jobs.get_connection(), "whatsapp-send")) == len(batches)


def test_an_email_fan_out_writes_one_message_per_recipient_in_batches(wa, settings):
    settings.EMAIL_BATCH_SIZE = 40
    wa["customers"](250)
    campaign = wa["campaign"](channel="email", status=Campaign.Status.SENDING)
    CampaignMetric.objects.create(campaign=campaign)
    assert fanout.campaign_fanout(campaign_id=campaign.pk, chunk=100) == 250
    assert fanout.campaign_fanout(campaign_id=campaign.pk, chunk=100) == 250
    mail = EmailMessage.objects.filter(campaign=campaign)
    assert mail.count() == 250 and mail.values("customer_id").distinct().count() == 250
    assert sorted(mail.values_list("batch", flat=True).distinct()) == list(range(7))  # 250 / 40
    assert {m.status for m in mail} == {"queued"} and len({m.token for m in mail}) == 250
    assert len(fairshare.queued_ids(jobs.get_connection(), "email-send")) == 7
    assert not WhatsappMessage.objects.filter(campaign=campaign).exists()


def _sending(wa) -> Campaign:
    campaign = wa["campaign"](status=Campaign.Status.SENDING)
    CampaignMetric.objects.create(campaign=campaign)
    return campaign


def test_the_tokens_made_by_the_database_are_unique_url_safe_a_pages_share_its_key_and_links_find_them(wa):
    wa["customers"](300)
    campaign = _sending(wa)
    assert fanout.campaign_fanout(campaign_id=campaign.pk, chunk=128) == 300
    rows = list(WhatsappMessage.objects.filter(campaign=campaign).order_by("customer_id"))
    tokens = [m.token for m in rows]
    # The page's random key (8 bytes, base64url) and the customer's id under the page's mask (hex).
    shape = re.compile(r"[A-Za-z0-9_-]{11}[0-9a-f]{16}")
    assert all(shape.fullmatch(t) for t in tokens), tokens[:5]
    assert len(set(tokens)) == 300
    keys = [t[:11] for t in tokens]
    pages = [keys[:128], keys[128:256], keys[256:]]
    assert [len(set(p)) for p in pages] == [1, 1, 1] and len(set(keys)) == 3  # a key per page, drawn anew
    # The id under the page's mask: one mask a page (0 has one chance in 2**62), drawn anew.
    masks = [int(t[11:], 16) ^ m.customer_id for m, t in zip(rows, tokens, strict=True)]
    by_page = [set(masks[:128]), set(masks[128:256]), set(masks[256:])]
    assert [len(p) for p in by_page] == [1, 1, 1] and len(set.union(*by_page)) == 3 and 0 not in masks
    message = WhatsappMessage.objects.filter(campaign=campaign).order_by("?").first()
    for kind in ("r", "u"):
        found = links.message_for(kind, links.link_token(kind, message))
        assert found is not None and found.pk == message.pk
        # The button's URL suffix: nothing to escape, as long as links.py says (73 characters).
        assert re.fullmatch(r"[ru]/[A-Za-z0-9_\-]{27}\.[A-Za-z0-9_\-]{43}", links.link_path(kind, message))
    forged = links.link_token("r", message).replace(
        message.token, tokens[0] if message.token != tokens[0] else tokens[1]
    )
    assert links.message_for("r", forged) is None  # another message's token under this one's signature


def test_a_page_straight_insert_that_meets_messages_written_meanwhile_is_written_again_without_them(wa):
    people = wa["customers"](120)
    campaign = _sending(wa)
    # A concurrent run wrote two of the page's messages after this run looked (again=False).
    WhatsappMessage.objects.create(campaign=campaign, organization=campaign.organization, customer=people[3])
    WhatsappMessage.objects.create(campaign=campaign, organization=campaign.organization, customer=people[70])
    page = fanout.read_page(
        campaign, selectors.campaign_audience(campaign=campaign).order_by("pk").values("pk")[:100]
    )
    read, queued, last, again = fanout._fanout_page(
        campaign, WhatsappMessage, page, plan=fanout.FanoutPlan(size=50), again=False
    )
    assert (read, queued, last, again) == (100, 100, people[99].pk, True)
    messages = WhatsappMessage.objects.filter(campaign=campaign)
    assert messages.count() == 100
    assert set(messages.values_list("customer_id", flat=True)) == {p.pk for p in people[:100]}


def test_a_campaign_deleted_while_a_page_is_written_takes_that_page_with_it(wa):
    """The message rows have no foreign-key constraint: the page holds the campaign's row and the
    deletion waits for it, then deletes the page's messages too; the next page finds it gone."""
    wa["customers"](400)
    campaign = _sending(wa)
    page = fanout.read_page(
        campaign, selectors.campaign_audience(campaign=campaign).order_by("pk").values("pk")[:300]
    )
    written, finish = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def write_page() -> None:
        try:
            with transaction.atomic():
                fanout._fanout_page(
                    campaign, WhatsappMessage, page, plan=fanout.FanoutPlan(size=50), again=False
                )
                written.set()
                finish.wait(60)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def delete_campaign() -> None:
        try:
            Campaign.objects.filter(pk=campaign.pk).delete()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    writer = threading.Thread(target=write_page)
    writer.start()
    assert written.wait(60)
    deleter = threading.Thread(target=delete_campaign)
    deleter.start()
    deadline = time.monotonic() + 60
    with connection.cursor() as cursor:  # the deletion waits on the page's lock
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the deletion never waited for the page")
    finish.set()
    writer.join(60)
    deleter.join(60)
    assert not errors, errors
    assert not Campaign.objects.filter(pk=campaign.pk).exists()
    assert not WhatsappMessage.objects.filter(campaign_id=campaign.pk).exists()  # no orphan
    rest = fanout.read_page(
        campaign, selectors.campaign_audience(campaign=campaign).order_by("pk").values("pk")[:300]
    )
    assert (
        fanout._fanout_page(campaign, WhatsappMessage, rest, plan=fanout.FanoutPlan(size=50), again=True)
        is None
    )
    assert not WhatsappMessage.objects.filter(campaign_id=campaign.pk).exists()


def test_deleting_a_customer_or_a_campaign_deletes_their_messages(wa):
    people = wa["customers"](30)
    campaign = _sending(wa)
    email = wa["campaign"](channel="email", status=Campaign.Status.SENDING)
    CampaignMetric.objects.create(campaign=email)
    fanout.campaign_fanout(campaign_id=campaign.pk)
    fanout.campaign_fanout(campaign_id=email.pk)
    people[0].delete()
    assert not WhatsappMessage.objects.filter(customer_id=people[0].pk).exists()
    assert not EmailMessage.objects.filter(customer_id=people[0].pk).exists()
    assert WhatsappMessage.objects.filter(campaign=campaign).count() == 29
    Campaign.objects.filter(pk__in=[campaign.pk, email.pk]).delete()
    assert not WhatsappMessage.objects.exists() and not EmailMessage.objects.exists()


def check_a_message_whose_customer_was_deleted_is_skipped(world: dict, run_jobs) -> None:
    """`world`: the wa or em fixture (the campaign factory makes a campaign of its channel)."""
    people = world["customers"](3)
    campaign = lifecycle.campaign_start(campaign=world["campaign"]())
    run_jobs(["campaign-trigger"])
    model = campaign.message_model
    assert model.objects.filter(campaign=campaign).count() == 3
    # A deletion that committed after the page read the customer: its cascade missed the message.
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM crm_customer WHERE id = %s", [people[1].pk])
    run_jobs()
    orphan = model.objects.get(campaign=campaign, customer_id=people[1].pk)
    assert (orphan.status, orphan.error_reason) == ("skipped", lifecycle.CUSTOMER_DELETED)
    statuses = set(model.objects.filter(campaign=campaign).values_list("status", flat=True))
    assert statuses == {"sent", "skipped"}
    metric = CampaignMetric.objects.get(campaign=campaign)
    assert (metric.sent, metric.skipped) == (2, 1)
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT


def test_a_message_whose_customer_was_deleted_as_the_fan_out_wrote_it_is_skipped_and_counted(wa, run_jobs):
    check_a_message_whose_customer_was_deleted_is_skipped(wa, run_jobs)


def _connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("in_transaction", [False, True])
def test_each_page_is_read_with_its_caps_beside_the_write_before_it_or_in_the_callers_transaction(
    wa, monkeypatch, in_transaction
):
    """Outside a transaction the pages after the first are read (and their caps checked) on a
    second connection while the page before is written, which closes when the fan-out ends; inside
    one (a caller's), on its connection. Either way every recipient once, the capped ones (spread
    over the pages) skipped with their reason."""
    people = wa["customers"](250)
    other = _sending(wa)
    capped = people[5::40]  # each page has some: reached by another campaign an hour ago
    WhatsappMessage.objects.bulk_create(
        WhatsappMessage(
            campaign=other,
            organization=other.organization,
            customer=person,
            status=WhatsappMessage.Status.SENT,
            sent_at=timezone.now() - timedelta(hours=1),
        )
        for person in capped
    )
    campaign = _sending(wa)
    threads: list[str] = []
    read = fanout.read_page

    def spied(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return read(*args, **kwargs)

    monkeypatch.setattr(fanout, "read_page", spied)
    before = _connections()
    if in_transaction:
        with transaction.atomic():
            assert fanout.campaign_fanout(campaign_id=campaign.pk, chunk=100) == 250
    else:
        assert fanout.campaign_fanout(campaign_id=campaign.pk, chunk=100) == 250
    assert len(threads) == 3
    if in_transaction:
        assert set(threads) == {threading.current_thread().name}
    else:
        assert all(name.startswith("fanout-pages") for name in threads)
        deadline = time.monotonic() + 60  # the reader's connection closes as its thread ends
        while _connections() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _connections() == before
    rows = dict(WhatsappMessage.objects.filter(campaign=campaign).values_list("customer_id", "status"))
    assert len(rows) == 250
    assert {pk for pk, status in rows.items() if status == "skipped"} == {p.pk for p in capped}
    reasons = set(
        WhatsappMessage.objects.filter(campaign=campaign, status="skipped").values_list(
            "error_reason", flat=True
        )
    )
    assert reasons == {caps.SENT_WITHIN_24H}
    assert CampaignMetric.objects.get(campaign=campaign).skipped == len(capped)
