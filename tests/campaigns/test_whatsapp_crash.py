"""A worker SIGKILLed in the middle of a WhatsApp campaign: every message ends final, nobody twice."""

from __future__ import annotations

import signal

import pytest
from django.db.models import Count

from campaigns import services
from campaigns.models import Campaign, WhatsappMessage
from tests.conftest import child_env, wait_for

pytestmark = pytest.mark.slow


def test_a_worker_killed_mid_campaign_loses_nothing_and_sends_nobody_twice(wa, sandbox, worker_process):
    wa["customers"](2000)
    sandbox.configure(latency_ms=60)
    campaign = services.campaign_start(campaign=wa["campaign"]())
    env = child_env(WHATSAPP_BATCH_SIZE="250")
    victim = worker_process("--queues", "campaign-trigger,whatsapp-send", env=env)
    wait_for(lambda: sandbox.stats()["accepted"] >= 400, timeout=90, what="sends to start")
    victim.kill(signal.SIGKILL)
    at_kill = sandbox.stats()["accepted"]
    assert at_kill < 2000, "the worker finished before it could be killed; raise the latency"

    survivor = worker_process("--queues", "campaign-trigger,whatsapp-send", "--burst", env=env)
    assert survivor.wait(timeout=180) == 0
    # Messages the dead worker had claimed have an unknown outcome: settled, never resent.
    settled = services.reconcile_in_flight(older_than_seconds=0)
    statuses = dict(
        WhatsappMessage.objects.filter(campaign=campaign)
        .values_list("status")
        .annotate(n=Count("id"))
        .order_by()
    )
    assert set(statuses) <= {"sent", "failed"}, statuses
    assert sum(statuses.values()) == 2000
    stats = sandbox.stats()
    assert stats["by_recipient_max"] == 1
    assert statuses.get("failed", 0) == settled <= 250  # at most the batch that was in flight
    # Meta accepted every message we recorded as sent, plus some of the unknown-outcome ones.
    assert 0 <= stats["accepted"] - statuses["sent"] <= settled
    wait_for(lambda: Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT, timeout=5)
