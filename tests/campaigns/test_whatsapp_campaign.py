"""WhatsApp campaigns end to end against the Meta sandbox: real PostgreSQL, Redis, workers, HTTP."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from campaigns import caps, fanout, lifecycle
from campaigns import recovery as campaign_recovery
from campaigns.models import Campaign, CampaignMetric, WhatsappMessage
from crm import fairshare, jobs, recovery
from crm.models import Organization
from integrations.whatsapp import phones
from tests.campaigns.conftest import TOKEN
from tests.conftest import redis_keys_holding, wait_for

S = WhatsappMessage.Status


def _statuses(campaign: Campaign) -> dict[str, int]:
    from campaigns.selectors import campaign_counts

    return {k: v for k, v in campaign_counts(campaign_id=campaign.pk).items() if v}


def test_a_campaign_sends_once_to_each_recipient_and_completes(wa, sandbox, run_jobs):
    people = wa["customers"](30)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    assert campaign.status == Campaign.Status.SENDING
    assert WhatsappMessage.objects.count() == 0  # the request returned before any fan-out
    run_jobs()
    campaign.refresh_from_db()
    assert _statuses(campaign) == {"sent": 30}
    assert campaign.status == Campaign.Status.SENT and campaign.finished_at
    received = sandbox.messages()
    assert len(received) == 30
    assert len({m["to"] for m in received}) == 30
    metric = CampaignMetric.objects.get(campaign=campaign)
    assert (metric.queued, metric.sent, metric.failed, metric.skipped) == (30, 30, 0, 0)
    assert metric.cost == Decimal("0.0625") * 30
    # what Meta received for the first customer
    msg = WhatsappMessage.objects.get(customer=people[0])
    sent = next(m for m in received if m["to"] == msg.phone.lstrip("+"))
    assert sent["biz_opaque_callback_data"] == f"m:{msg.pk}"
    components = {c["type"] + c.get("index", ""): c for c in sent["template"]["components"]}
    assert components["body"]["parameters"] == [{"type": "text", "text": "Cliente0"}]
    from campaigns import links

    assert components["button0"]["parameters"][0]["text"] == links.link_path("r", msg)
    assert components["button1"]["parameters"][0]["text"] == links.link_path("u", msg)
    assert msg.wamid == sent["wamid"] and msg.wa_id == msg.phone.lstrip("+")


def test_fan_out_is_bulk_not_one_round_trip_per_recipient(wa, run_jobs, settings):
    settings.WHATSAPP_BATCH_SIZE = 250
    wa["customers"](3000)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    with CaptureQueriesContext(connection) as queries:
        total = fanout.campaign_fanout(campaign_id=campaign.pk, chunk=1000)
    assert total == 3000
    assert len(queries) < 25, [q["sql"][:80] for q in queries]
    assert len(fairshare.queued_ids(jobs.get_connection(), "whatsapp-send")) == 12  # 3,000 / 250 batches
    # running the fan-out again (a crash and a retry) adds nothing
    assert fanout.campaign_fanout(campaign_id=campaign.pk) == 3000
    assert len(fairshare.queued_ids(jobs.get_connection(), "whatsapp-send")) == 12


def test_an_empty_template_variable_skips_the_message_and_meta_never_sees_it(wa, sandbox, run_jobs):
    wa["customers"](3)
    nameless = wa["customers"](1, start=10, name="")[0]
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    msg = WhatsappMessage.objects.get(customer=nameless)
    assert msg.status == S.SKIPPED
    assert "empty template variable {{1}} (first_name)" in msg.error_reason
    assert nameless.phone.lstrip("+") not in {m["to"] for m in sandbox.messages()}
    assert CampaignMetric.objects.get(campaign=campaign).skipped == 1


# Names as people type them and ERPs export them, with the first name and the whole name Meta gets.
NAMES_AS_TYPED = [
    ("\tMaria Souza", "Maria", "Maria Souza"),
    ("JOSÉ\r\nDA SILVA", "José", "JOSÉ DA SILVA"),
    ("Ana     Paula", "Ana", "Ana Paula"),
    (" Pedro Henrique", "Pedro", "Pedro Henrique"),
    ("💖 Bia\n", "Bia", "💖 Bia"),
    ("MARIA DA SILVA", "Maria", "MARIA DA SILVA"),
    ("Luiza\u2028Lima", "Luiza", "Luiza Lima"),
    ("Carla\u00a0\u00a0\u00a0\u00a0\u00a0Dias", "Carla", "Carla Dias"),
    ("Xavier" * 33, "Xavier" * 33, "Xavier" * 33),
]


def test_customers_named_as_people_type_them_all_get_the_campaign(wa, sandbox, run_jobs):
    people = [wa["customers"](1, start=i, name=name)[0] for i, (name, _, _) in enumerate(NAMES_AS_TYPED)]
    blank = wa["customers"](1, start=50, name=" \t\n ")[0]
    campaign = lifecycle.campaign_start(campaign=wa["campaign"](template_variables=["first_name", "name"]))
    run_jobs()
    campaign.refresh_from_db()
    # Everyone is sent to (the sandbox refuses with 132018 what Meta refuses); the campaign completes.
    assert campaign.status == Campaign.Status.SENT and not campaign.stop_reason
    assert _statuses(campaign) == {"sent": len(NAMES_AS_TYPED), "skipped": 1}
    assert sandbox.stats()["rejected"] == 0
    for person, (_, first, whole) in zip(people, NAMES_AS_TYPED, strict=True):
        [sent] = sandbox.messages(to=person.phone)
        body = next(c for c in sent["template"]["components"] if c["type"] == "body")
        assert [p["text"] for p in body["parameters"]] == [first, whole]
    # A name with nothing in it still falls back as before: skipped, never sent empty.
    msg = WhatsappMessage.objects.get(customer=blank)
    assert msg.status == S.SKIPPED and "empty template variable {{1}} (first_name)" in msg.error_reason


def test_a_132018_from_meta_fails_that_message_and_the_campaign_completes(wa, sandbox, run_jobs, settings):
    settings.WHATSAPP_BATCH_SIZE = 3
    people = wa["customers"](7)
    sandbox.add_rule(to=people[1].phone.lstrip("+"), code=132018)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT and not campaign.stop_reason
    msg = WhatsappMessage.objects.get(customer=people[1])
    assert (msg.status, msg.error_code, msg.attempts) == (S.FAILED, 132018, 1)
    assert "new-line/tab" in msg.error_reason and msg.failed_at
    assert _statuses(campaign) == {"sent": 6, "failed": 1}
    assert len(sandbox.messages()) == 6
    assert CampaignMetric.objects.get(campaign=campaign).failed == 1


def test_131050_fails_the_message_and_records_the_opt_out(wa, sandbox, run_jobs):
    people = wa["customers"](5)
    sandbox.add_rule(to=people[2].phone.lstrip("+"), code=131050)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    msg = WhatsappMessage.objects.get(customer=people[2])
    assert (msg.status, msg.error_code) == (S.FAILED, 131050)
    people[2].refresh_from_db()
    assert people[2].whatsapp_opted_out_at is not None and people[2].whatsapp_opt_out_source == "provider"
    assert _statuses(campaign) == {"sent": 4, "failed": 1}


def test_a_retryable_error_gets_a_second_attempt_and_then_fails_with_its_code(wa, sandbox, run_jobs):
    flaky, broken, _fine = wa["customers"](3)
    sandbox.add_rule(to=flaky.phone.lstrip("+"), code=131056, times=1)
    sandbox.add_rule(to=broken.phone.lstrip("+"), http_status=503)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    flaky_msg = WhatsappMessage.objects.get(customer=flaky)
    broken_msg = WhatsappMessage.objects.get(customer=broken)
    assert (flaky_msg.status, flaky_msg.attempts) == (S.SENT, 2)
    assert (broken_msg.status, broken_msg.attempts) == (S.FAILED, 2)
    assert broken_msg.error_code == 2
    assert len(sandbox.messages()) == 2
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT
    assert CampaignMetric.objects.get(campaign=campaign).failed == 1


def test_a_send_that_times_out_is_unknown_never_resent_until_meta_reports_it(
    wa, sandbox, run_jobs, monkeypatch
):

    from campaigns import statuses
    from integrations import http
    from integrations.whatsapp import webhooks

    # Meta answers after the worker stopped waiting: the request may well have been accepted.
    monkeypatch.setattr(http, "POOL_ANSWER_TIMEOUT", 0.3)
    sandbox.configure(latency_ms=1000)
    person = wa["customers"](1)[0]
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    msg = WhatsappMessage.objects.get(customer=person)
    # One attempt: a resend of a request Meta may have accepted could reach the customer twice.
    assert (msg.status, msg.attempts, msg.wamid, msg.failed_at) == (S.UNKNOWN, 1, None, None)
    assert msg.error_reason.startswith("outcome unknown: timeout")
    metric = CampaignMetric.objects.get(campaign=campaign)
    assert (metric.unknown, metric.failed, metric.sent) == (1, 0, 0)
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT

    # Meta did accept it (the sandbox recorded the send): its status webhook settles it, once.
    wait_for(lambda: sandbox.messages(), timeout=10, what="the sandbox to record the send")
    assert len(sandbox.messages()) == 1  # the one attempt (run_jobs has drained every queue)
    accepted = sandbox.messages()[-1]
    assert accepted["biz_opaque_callback_data"] == f"m:{msg.pk}"
    event = {
        "id": accepted["wamid"],
        "status": "delivered",
        "timestamp": str(int(timezone.now().timestamp())),
        "recipient_id": accepted["wa_id"],
        "biz_opaque_callback_data": accepted["biz_opaque_callback_data"],
        "pricing": {"billable": True, "pricing_model": "PMP", "category": "marketing"},
    }
    payload = {
        "object": "whatsapp_business_account",
        "entry": [{"changes": [{"value": {"statuses": [event]}}]}],
    }
    for _ in range(2):
        statuses.statuses_apply(events=webhooks.parse(payload).statuses)
    msg.refresh_from_db()
    assert (msg.status, msg.wamid, msg.cost) == (S.DELIVERED, accepted["wamid"], Decimal("0.0625"))
    metric.refresh_from_db()
    assert (metric.unknown, metric.failed, metric.sent, metric.delivered) == (0, 0, 1, 1)
    assert metric.cost == Decimal("0.0625")


def test_a_send_that_cannot_connect_fails_it_never_reached_meta(wa, sandbox, run_jobs):
    from tests.conftest import free_port

    person = wa["customers"](1)[0]
    number = wa["number"]
    number.graph_url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    number.save(update_fields=["graph_url"])
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    msg = WhatsappMessage.objects.get(customer=person)
    assert (msg.status, msg.attempts) == (S.FAILED, 2) and msg.error_reason.startswith("connection error")
    metric = CampaignMetric.objects.get(campaign=campaign)
    assert (metric.unknown, metric.failed) == (0, 1)


def test_throughput_errors_delay_without_spending_an_attempt(wa, sandbox, run_jobs):
    person = wa["customers"](1)[0]
    sandbox.add_rule(to=person.phone.lstrip("+"), code=130429, times=2)
    lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs(settle=12)  # two 5 s throttle delays
    msg = WhatsappMessage.objects.get(customer=person)
    assert (msg.status, msg.attempts) == (S.SENT, 1)


def test_a_broken_template_stops_the_campaign(wa, sandbox, run_jobs, settings):
    settings.WHATSAPP_BATCH_SIZE = 5
    wa["customers"](20)
    sandbox.add_rule(to="*", code=132001)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.STOPPED
    assert "132001" in campaign.stop_reason
    counts = _statuses(campaign)
    assert counts["failed"] <= 5 and counts["failed"] + counts["cancelled"] == 20
    assert sandbox.messages() == []


def test_a_locked_business_account_pauses_the_organization_and_loses_no_message(wa, sandbox, run_jobs):
    wa["customers"](4)
    sandbox.add_rule(to="*", code=131031)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs(settle=1)
    org = Organization.objects.get(pk=wa["org"].pk)
    assert org.whatsapp_paused_at is not None and "131031" in org.whatsapp_paused_reason
    wa["number"].refresh_from_db()
    assert wa["number"].paused_at is None  # the account, not the number
    assert _statuses(campaign) == {"queued": 4}
    assert set(WhatsappMessage.objects.values_list("attempts", flat=True)) == {0}
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENDING


def test_the_message_limit_and_the_conflict_block_skip_customers(wa, sandbox, run_jobs):
    limited, busy, free = wa["customers"](3)
    earlier = wa["campaign"](name="Earlier", status=Campaign.Status.SENT)
    other = wa["campaign"](
        name="Other", status=Campaign.Status.SENDING, started_at=timezone.now() - timedelta(minutes=5)
    )
    org = wa["org"]
    # `limited` got 2 messages (the limit) in the last 7 days; `busy` has another campaign in flight
    WhatsappMessage.objects.create(
        campaign=earlier,
        organization=org,
        customer=limited,
        status=S.DELIVERED,
        sent_at=timezone.now() - timedelta(days=3),
    )
    second = wa["campaign"](name="Earlier 2", status=Campaign.Status.SENT)
    WhatsappMessage.objects.create(
        campaign=second,
        organization=org,
        customer=limited,
        status=S.READ,
        sent_at=timezone.now() - timedelta(days=6),
    )
    WhatsappMessage.objects.create(campaign=other, organization=org, customer=busy, status=S.QUEUED)
    org.block_multiple_campaigns = True
    org.message_limit_count, org.message_limit_days = 2, 7
    org.save()
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs(["campaign-trigger", "whatsapp-send"])
    by_customer = {m.customer_id: m for m in WhatsappMessage.objects.filter(campaign=campaign)}
    assert by_customer[limited.pk].status == S.SKIPPED
    assert "message limit" in by_customer[limited.pk].error_reason
    assert by_customer[busy.pk].status == S.SKIPPED
    assert by_customer[busy.pk].error_reason == caps.QUEUED_EARLIER
    assert by_customer[free.pk].status == S.SENT
    assert [m["to"] for m in sandbox.messages()] == [free.phone.lstrip("+")]


def test_two_campaigns_started_together_send_once_to_a_shared_customer(wa, sandbox, run_jobs):
    org = wa["org"]
    org.block_multiple_campaigns = True
    org.save()
    wa["customers"](5)
    first = lifecycle.campaign_start(campaign=wa["campaign"](name="First"))
    second = lifecycle.campaign_start(campaign=wa["campaign"](name="Second"))
    run_jobs()
    assert _statuses(first) == {"sent": 5}
    assert _statuses(second) == {"skipped": 5}
    assert sandbox.stats()["by_recipient_max"] == 1


def test_cancel_pause_resume_and_retry_failed(wa, sandbox, run_jobs, english):
    people = wa["customers"](6)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    lifecycle.campaign_pause(campaign=campaign)
    run_jobs(settle=0)
    assert sandbox.messages() == [] and _statuses(campaign) == {"queued": 6}
    lifecycle.campaign_resume(campaign=campaign)
    sandbox.add_rule(to=people[0].phone.lstrip("+"), code=131026)
    run_jobs(settle=0)
    assert _statuses(campaign) == {"sent": 5, "failed": 1}
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT
    sandbox.reset()
    assert lifecycle.campaign_retry_failed(campaign=campaign) == 1
    run_jobs()
    assert _statuses(campaign) == {"sent": 6}
    assert [m["to"] for m in sandbox.messages()] == [people[0].phone.lstrip("+")]
    with pytest.raises(lifecycle.CampaignError, match="cannot be cancelled"):
        lifecycle.campaign_cancel(campaign=Campaign.objects.get(pk=campaign.pk))
    # Everyone got the first campaign today: the 24-hour block would skip them all at the fan-out.
    Organization.objects.filter(pk=wa["org"].pk).update(block_multiple_campaigns=False)
    fresh = wa["campaign"](name="To cancel")
    lifecycle.campaign_start(campaign=fresh)
    run_jobs(["campaign-trigger"])
    assert lifecycle.campaign_cancel(campaign=fresh) == 6
    run_jobs()
    assert _statuses(fresh) == {"cancelled": 6}


def test_redis_flushed_mid_campaign_is_finished_from_the_database(wa, sandbox, run_jobs, redis_db):
    wa["customers"](120)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs(["campaign-trigger"])  # fanned out: 3 batches queued in Redis
    redis_db.flushdb()
    assert recovery.recover()["whatsapp-batches"] == 3
    assert recovery.recover()["whatsapp-batches"] == 0
    run_jobs()
    assert _statuses(campaign) == {"sent": 120}
    stats = sandbox.stats()
    assert (stats["accepted"], stats["by_recipient_max"]) == (120, 1)


def test_no_access_token_is_ever_in_redis_or_in_the_database_in_clear(wa, run_jobs, redis_db):
    wa["customers"](10)
    lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    assert redis_keys_holding(redis_db, TOKEN) == []
    redis_db.hset("probe", "field", f"Bearer {TOKEN}")  # the scan does find a token where one is
    assert redis_keys_holding(redis_db, TOKEN) == [b"probe"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT access_token_encrypted FROM integrations_whatsappnumber")
        stored = cursor.fetchone()[0]
    assert TOKEN not in stored and stored.startswith("enc1:")


def test_in_flight_messages_of_a_dead_worker_are_settled_not_resent(wa, sandbox, run_jobs):
    wa["customers"](3)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs(["campaign-trigger"])
    # A worker claimed the batch and died before recording the outcome.
    WhatsappMessage.objects.update(
        status=S.SENDING, attempts=1, sending_at=timezone.now() - timedelta(hours=1)
    )
    conn = jobs.get_connection()
    conn.delete("rq:queue:whatsapp-send", *conn.scan_iter("crm:fair:whatsapp-send:*"))  # the jobs lost
    assert campaign_recovery.reconcile_in_flight() == 3
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT
    assert _statuses(campaign) == {"unknown": 3}  # Meta may still report them: not failed
    assert CampaignMetric.objects.get(campaign=campaign).unknown == 3
    assert CampaignMetric.objects.get(campaign=campaign).failed == 0
    assert "outcome unknown" in WhatsappMessage.objects.first().error_reason
    run_jobs()
    assert sandbox.messages() == []


def test_campaign_commands(transactional_db, run_jobs, english):
    from project.demo.integrations import DEMO_ACCESS_TOKEN, DEMO_PHONE_NUMBER_IDS
    from project.sandboxes.whatsapp import SandboxServer

    with SandboxServer(numbers=dict.fromkeys(DEMO_PHONE_NUMBER_IDS, DEMO_ACCESS_TOKEN)) as sandbox:
        _run_commands(sandbox, run_jobs)


def _run_commands(sandbox, run_jobs):
    out = StringIO()
    call_command("demo", customers=3, graph_url=sandbox.url, stdout=out)
    out = StringIO()
    call_command("demo_campaign", "--channel", "whatsapp", stdout=out)
    campaign_id = int(out.getvalue().strip())
    call_command("campaign_start", str(campaign_id), stdout=StringIO())
    run_jobs()
    out = StringIO()
    call_command("campaign_status", str(campaign_id), "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["status"] == "sent"
    assert set(data["counts"]) >= {"queued", "sending", "sent", "delivered", "read", "failed", "skipped"}
    assert data["counts"]["sent"] == 3 and "cost" in data and "rate" in data
    with pytest.raises(Exception, match="only a draft or scheduled"):
        call_command("campaign_start", str(campaign_id), stdout=StringIO())


@pytest.mark.parametrize(
    ("raw", "e164"),
    [
        ("+55 11 98765-4321", "+5511987654321"),
        ("11987654321", "+5511987654321"),
        ("5511987654321", "+5511987654321"),
        ("(11) 8765-4321", "+5511987654321"),  # 8-digit mobile gets its ninth digit
        ("+55 11 3456-7890", "+551134567890"),  # landline stays
        ("123", None),
        ("", None),
    ],
)
def test_phone_numbers_become_e164_the_brazilian_way(raw, e164):
    assert phones.normalize_phone(raw) == e164


def test_a_token_under_a_retired_key_stops_the_campaign_for_good(wa, sandbox, run_jobs, settings):
    """Poison work ends: the batch cannot read its number's token (encrypted under a key no longer
    configured), so the campaign stops with the reason after the batch's attempts, its messages are
    cancelled, nothing is sent, and the recovery pass revives nothing."""
    wa["customers"](6)
    number = wa["number"]
    current = settings.ENCRYPTION_KEYS
    settings.ENCRYPTION_KEYS = [b"r" * 32]  # a key since retired
    number.set_access_token(TOKEN)
    number.save(update_fields=["access_token_encrypted"])
    settings.ENCRYPTION_KEYS = current
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.STOPPED
    assert "which is not configured" in campaign.stop_reason
    assert _statuses(campaign) == {"cancelled": 6}
    assert sum(recovery.recover().values()) == 0
    run_jobs()
    assert sandbox.messages() == []
    out = StringIO()
    call_command("campaign_status", str(campaign.pk), "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["status"] == "stopped" and "not configured" in shown["stop_reason"]


def test_a_batch_given_up_fails_its_messages_and_the_campaign_completes(wa, sandbox, run_jobs, settings):
    """A batch that cannot succeed for a reason that is not the campaign's configuration: its
    queued messages become FAILED with the reason, counted, and the campaign completes."""
    settings.WHATSAPP_BATCH_SIZE = 3
    wa["customers"](6)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs(["campaign-trigger"])  # fanned out, nothing sent yet
    assert _statuses(campaign) == {"queued": 6}
    messages = WhatsappMessage.objects.filter(campaign=campaign)
    first = messages.order_by("batch").values_list("batch", flat=True)[0]
    recovery.give_up(
        func="campaigns.tasks.whatsapp_send_batch",
        kwargs={"campaign_id": campaign.pk, "batch": first},
        reason="KeyError on its last attempt: 'x'",
    )
    run_jobs()
    campaign.refresh_from_db()
    assert _statuses(campaign) == {"failed": 3, "sent": 3}
    reasons = set(messages.filter(status="failed").values_list("error_reason", flat=True))
    assert reasons == {"KeyError on its last attempt: 'x'"}
    assert CampaignMetric.objects.get(campaign=campaign).failed == 3
    assert campaign.status == Campaign.Status.SENT
    assert sum(recovery.recover().values()) == 0


def test_a_throttle_waits_as_long_as_meta_asks_in_retry_after(wa, sandbox, run_jobs):
    """Meta (or the proxy in front of it) answers 429 with Retry-After: the batch comes back no
    sooner than asked (not the default 5 s), without spending an attempt."""
    from rq.registry import ScheduledJobRegistry

    from crm import jobs

    person = wa["customers"](1)[0]
    sandbox.add_rule(to=person.phone.lstrip("+"), code=130429, times=1, retry_after=120)
    lifecycle.campaign_start(campaign=wa["campaign"]())
    before = time.time()
    run_jobs(settle=3)
    msg = WhatsappMessage.objects.get(customer=person)
    assert (msg.status, msg.attempts) == (S.QUEUED, 0)
    registry = ScheduledJobRegistry(queue=jobs.get_queue("whatsapp-send"))
    due = [registry.get_scheduled_time(job_id).timestamp() for job_id in registry.get_job_ids()]
    assert len(due) == 1 and due[0] >= before + 110, [d - before for d in due]
