"""One pending Chatwoot push per organization (crm.jobs.Pending): messages written while a push
runs against a slow Chatwoot cost one more pass, not a job each, and arrive in order; a flushed
Redis or a marker left by a killed worker loses nothing (`recover`). Real PostgreSQL, Redis, RQ
and the Chatwoot sandbox over loopback HTTP."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection as db_connection
from django.db import transaction
from django.utils import timezone

from crm import jobs, recovery
from messaging import chatwoot_inbound, tasks
from messaging.models import ConversationMessage
from project.sandboxes.chatwoot import ChatwootSandbox
from tests.campaigns.test_conversations import ACCOUNT_ID, CW_TOKEN, INBOX_ID, _chatwoot


@pytest.fixture
def cw():
    with ChatwootSandbox(accounts={ACCOUNT_ID: CW_TOKEN}, inboxes={INBOX_ID: ACCOUNT_ID}) as server:
        yield server


def _batch(org, people, n: int) -> None:
    """What the inbox drain does with a batch of inbound messages: rows, then a push asked for."""
    with transaction.atomic():
        ConversationMessage.objects.bulk_create(
            [
                ConversationMessage(
                    organization=org,
                    customer=person,
                    direction=ConversationMessage.Direction.INBOUND,
                    text=f"{person.pk} lote {n}",
                    wamid=f"wamid.P{person.pk}.{n}",
                    chatwoot_pending=True,
                )
                for person in people
            ]
        )
        chatwoot_inbound.push_enqueue(organization_id=org.pk)


@pytest.fixture
def counted(monkeypatch):
    """How many pushes were enqueued and how many times one ran (a deferred run counts again)."""
    seen = {"enqueued": 0, "runs": 0}
    enqueue, push = chatwoot_inbound._enqueue, tasks.chatwoot_push

    def counting_enqueue(organization_id: int) -> None:
        seen["enqueued"] += 1
        enqueue(organization_id)

    def counting_push(organization_id: int) -> int:
        seen["runs"] += 1
        return push(organization_id)

    monkeypatch.setattr(chatwoot_inbound, "_enqueue", counting_enqueue)
    monkeypatch.setattr(tasks, "chatwoot_push", counting_push)
    return seen


def _wait(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout  # a hang guard, not a duration asserted
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_batches_written_while_chatwoot_is_slow_cost_at_most_two_pushes_and_arrive_in_order(
    wa, run_jobs, cw, counted
):
    _chatwoot(wa["org"], cw)
    cw.set_latency(150)
    people = wa["customers"](3)
    batches = 12
    _batch(wa["org"], people, 0)
    done = threading.Event()

    def more() -> None:  # the other batches come while the first push talks to Chatwoot
        try:
            _wait(lambda: cw.requests(), "the first push to reach Chatwoot")
            for n in range(1, batches):
                _batch(wa["org"], people, n)
        finally:
            db_connection.close()
            done.set()

    writer = threading.Thread(target=more)
    writer.start()
    deadline = time.monotonic() + 120
    while not (done.is_set() and not chatwoot_inbound.waiting()):
        assert time.monotonic() < deadline, "messages still waiting for Chatwoot"
        run_jobs(["chatwoot-inbound"], settle=0)
    writer.join()
    assert counted["enqueued"] <= 2 and counted["runs"] <= 2, counted
    assert ConversationMessage.objects.filter(chatwoot_pending=True).count() == 0
    for person in people:
        theirs = [m["content"] for m in cw.messages() if m["content"].startswith(f"{person.pk} ")]
        assert theirs == [f"{person.pk} lote {n}" for n in range(batches)]


def test_a_push_asked_for_while_one_is_queued_enqueues_nothing_more(wa, run_jobs, cw, counted):
    _chatwoot(wa["org"], cw)
    people = wa["customers"](2)
    for n in range(5):
        _batch(wa["org"], people, n)
    assert counted["enqueued"] == 1
    run_jobs(["chatwoot-inbound"], settle=0)
    assert counted["runs"] == 1 and len(cw.messages()) == 10
    _batch(wa["org"], people, 5)  # the marker was given back: the next batch has its own push
    run_jobs(["chatwoot-inbound"], settle=0)
    assert counted["enqueued"] == 2 and len(cw.messages()) == 12


@pytest.mark.parametrize("lost", ["flushed", "marker-left-by-a-killed-worker"])
def test_a_lost_push_or_marker_loses_nothing_recover_delivers(wa, run_jobs, cw, counted, lost):
    _chatwoot(wa["org"], cw)
    people = wa["customers"](2)
    org = wa["org"].pk
    if lost == "flushed":
        _batch(wa["org"], people, 0)  # marker and flag set, push queued: then Redis loses them all
        jobs.get_connection().flushdb()
    else:
        # A worker killed -9 mid-push: its marker lives on, no job runs; writers enqueue nothing.
        chatwoot_inbound.PENDING.wake(org, lambda: None)
        _batch(wa["org"], people, 0)
        assert counted["enqueued"] == 0
    run_jobs(["chatwoot-inbound"], settle=0)
    assert chatwoot_inbound.waiting() == {org: 2} and not cw.messages()
    ConversationMessage.objects.update(created_at=timezone.now() - timedelta(minutes=1))
    assert recovery.recover()["chatwoot-inbound"] == 1
    run_jobs(["chatwoot-inbound"], settle=0)
    assert chatwoot_inbound.waiting() == {} and len(cw.messages()) == 2
    assert not jobs.get_connection().exists(chatwoot_inbound.PENDING.queued_key(org))


def test_while_chatwoot_is_down_one_push_waits_deferred_and_delivers_when_it_is_back(
    wa, run_jobs, cw, counted
):
    _chatwoot(wa["org"], cw)
    people = wa["customers"](1)
    cw.fail_next(1, status=503)
    _batch(wa["org"], people, 0)
    run_jobs(["chatwoot-inbound"], settle=0)  # Chatwoot down: the push defers itself
    for n in range(1, 4):
        _batch(wa["org"], people, n)
    assert counted["enqueued"] == 1  # the deferred push is the organization's one push
    run_jobs(["chatwoot-inbound"], settle=chatwoot_inbound.DOWN_DEFER + 5)
    assert [m["content"] for m in cw.messages()] == [f"{people[0].pk} lote {n}" for n in range(4)]
    assert counted["enqueued"] == 1 and counted["runs"] == 2
