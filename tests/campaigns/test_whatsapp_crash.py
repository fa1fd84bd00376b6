"""A worker SIGKILLed in the middle of a WhatsApp campaign: every message ends final, nobody twice."""

from __future__ import annotations

import signal
from decimal import Decimal

import pytest
from django.db.models import Count

from campaigns import lifecycle, recovery
from campaigns.models import Campaign, CampaignMetric, WhatsappMessage
from project.sandboxes.whatsapp import SandboxServer
from tests.conftest import WorkerProcess, child_env, wait_for

pytestmark = pytest.mark.slow

HOLD_MS = 600_000  # a sandbox delay no test waits out: what it holds is released by a shorter one


def kill_inside_a_send(victim: WorkerProcess, sandbox: SandboxServer, *, latency_ms: float) -> None:
    """SIGKILL `victim` while the sandbox holds one of its sends (so inside a batch, however slow the
    machine), then let the sandbox answer again with `latency_ms`."""
    sandbox.configure(latency_ms=HOLD_MS)
    wait_for(lambda: sandbox.stats()["in_flight"] >= 1, timeout=120, what="a send held by the sandbox")
    victim.kill(signal.SIGKILL)
    victim.wait(timeout=60)
    sandbox.configure(latency_ms=latency_ms)


def test_a_worker_killed_mid_campaign_loses_nothing_and_sends_nobody_twice(wa, sandbox, worker_process):
    wa["customers"](2000)
    sandbox.configure(latency_ms=60)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    env = child_env(WHATSAPP_BATCH_SIZE="250")
    victim = worker_process("--queues", "campaign-trigger,whatsapp-send", env=env)
    wait_for(lambda: sandbox.stats()["accepted"] >= 400, timeout=90, what="sends to start")
    kill_inside_a_send(victim, sandbox, latency_ms=60)
    at_kill = sandbox.stats()["accepted"]
    assert at_kill < 2000
    # What the dead worker had claimed: its batch in flight, or nothing when the kill landed between
    # two batches (then the job it had just taken holds a batch still queued).
    claimed = set(
        WhatsappMessage.objects.filter(campaign=campaign, status="sending").values_list("pk", flat=True)
    )

    # A running survivor (not --burst: the dead worker's job comes back once its heartbeat has
    # expired) sends everything but what the dead worker had claimed.
    survivor = worker_process("--queues", "campaign-trigger,whatsapp-send", env=env)
    wait_for(
        lambda: (
            not WhatsappMessage.objects.filter(campaign=campaign, status__in=["queued", "sending"])
            .exclude(pk__in=claimed)
            .exists()
        ),
        timeout=180,
        what="the survivor to send the rest",
    )
    survivor.kill(signal.SIGTERM)
    survivor.wait(timeout=60)
    # Messages the dead worker had claimed have an unknown outcome: settled, never resent.
    settled = recovery.reconcile_in_flight(older_than_seconds=0)
    statuses = dict(
        WhatsappMessage.objects.filter(campaign=campaign)
        .values_list("status")
        .annotate(n=Count("id"))
        .order_by()
    )
    assert set(statuses) <= {"sent", "unknown"}, statuses
    assert sum(statuses.values()) == 2000
    stats = sandbox.stats()
    assert stats["by_recipient_max"] == 1
    assert statuses.get("unknown", 0) == settled <= 250  # at most the batch that was in flight
    # Meta accepted every message we recorded as sent, plus some of the unknown-outcome ones.
    assert 0 <= stats["accepted"] - statuses["sent"] <= settled
    wait_for(lambda: Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT, timeout=60)


APP_SECRET = "meta-app-secret-for-the-crash-test"


@pytest.fixture
def meta_web(monkeypatch, request) -> str:
    """The production web server, holding the Meta app secret the sandbox signs its webhooks with."""
    monkeypatch.setenv("WHATSAPP_APP_SECRET", APP_SECRET)
    return request.getfixturevalue("web_server")


def test_messages_of_a_killed_worker_are_unknown_until_meta_reports_them_then_counted_and_priced_once(
    wa, sandbox, worker_process, meta_web
):
    wa["customers"](600)
    number = wa["number"]
    number.messages_per_second = 100
    number.save(update_fields=["messages_per_second"])
    # Meta reports each accepted message (sent, delivered, with its pricing) late: held until the
    # survivor has finished and the reconciliation has run, then released.
    sandbox.configure(
        webhook_url=f"{meta_web}/webhooks/whatsapp/",
        app_secret=APP_SECRET,
        status_delays_ms=[HOLD_MS, HOLD_MS],
    )
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    env = child_env(WHATSAPP_BATCH_SIZE="150")
    victim = worker_process("--queues", "campaign-trigger,whatsapp-send", env=env)
    wait_for(lambda: sandbox.stats()["accepted"] >= 200, timeout=90, what="the second batch to be sending")
    kill_inside_a_send(victim, sandbox, latency_ms=0)
    survivor = worker_process("--queues", "campaign-trigger,whatsapp-send", "--burst", env=env)
    assert survivor.wait(timeout=180) == 0

    settled = recovery.reconcile_in_flight(older_than_seconds=0)
    assert 0 < settled <= 150
    metric = CampaignMetric.objects.get(campaign=campaign)
    assert metric.unknown == settled and metric.failed == 0
    wait_for(lambda: Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT, timeout=60)

    # The dead worker's held send is accepted too (Meta had its request), though it never saw the answer.
    wait_for(lambda: sandbox.stats()["in_flight"] == 0, timeout=120, what="the held send to be answered")
    accepted = {int(m["biz_opaque_callback_data"][2:]) for m in sandbox.messages()}
    assert sandbox.stats()["by_recipient_max"] == 1  # nobody twice
    worker_process("--queues", "inbox")  # applies the webhooks the web server stores in the inbox
    sandbox.configure(status_delays_ms=[0, 0])  # Meta's late reports: now
    wait_for(
        lambda: sandbox.stats()["webhooks_delivered"] == 2 * len(accepted),
        timeout=300,
        what="Meta's late status webhooks",
    )
    assert sandbox.stats()["webhooks_failed"] == 0
    wait_for(
        lambda: not WhatsappMessage.objects.filter(pk__in=accepted).exclude(status="delivered").exists(),
        timeout=60,
        what="the inbox's worker to apply the webhooks",
    )
    rows = dict(WhatsappMessage.objects.filter(campaign=campaign).values_list("pk", "status"))
    assert len(rows) == 600
    # Every message Meta accepted is delivered, the ones of the dead worker's batch included; the rest
    # of that batch never reached Meta and stays unknown.
    assert {rows[pk] for pk in accepted} == {"delivered"}
    still_unknown = {pk for pk, status in rows.items() if status == "unknown"}
    assert still_unknown == set(rows) - accepted
    assert len(still_unknown) < settled  # some of the unknown were corrected by Meta's late reports
    metric.refresh_from_db()
    assert (metric.sent, metric.delivered, metric.failed) == (len(accepted), len(accepted), 0)
    assert metric.unknown == len(still_unknown)
    # The dead worker never recorded a cost: the webhooks' pricing did, once per message.
    costs = set(WhatsappMessage.objects.filter(pk__in=accepted).values_list("cost", flat=True))
    assert costs == {Decimal("0.0625")}
    assert metric.cost == Decimal("0.0625") * len(accepted)
