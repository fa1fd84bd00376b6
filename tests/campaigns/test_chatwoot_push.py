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
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from crm import jobs, recovery
from messaging import chatwoot_inbound, tasks
from messaging.models import ConversationMessage
from project.sandboxes.chatwoot import ChatwootSandbox
from tests.campaigns.test_conversations import ACCOUNT_ID, CW_TOKEN, INBOX_ID, _chatwoot
from tests.conftest import child_env


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


def _push_while_writing(run_jobs, write) -> None:
    """Run the pushes in this thread until `write` (another thread, while they talk to Chatwoot)
    is done and nothing waits."""
    done = threading.Event()

    def writer_body() -> None:
        try:
            write()
        finally:
            db_connection.close()
            done.set()

    writer = threading.Thread(target=writer_body)
    writer.start()
    deadline = time.monotonic() + 120  # a hang guard
    while not (done.is_set() and not chatwoot_inbound.waiting()):
        assert time.monotonic() < deadline, "messages still waiting for Chatwoot"
        run_jobs(["chatwoot-inbound"], settle=0)
    writer.join()


def test_batches_written_while_chatwoot_is_slow_cost_at_most_two_pushes_and_arrive_in_order(
    wa, run_jobs, cw, counted
):
    _chatwoot(wa["org"], cw)
    cw.set_latency(150)
    people = wa["customers"](3)
    batches = 12
    _batch(wa["org"], people, 0)

    def more() -> None:  # the other batches come while the first push talks to Chatwoot
        _wait(lambda: cw.requests(), "the first push to reach Chatwoot")
        for n in range(1, batches):
            _batch(wa["org"], people, n)

    _push_while_writing(run_jobs, more)
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


@pytest.mark.slow
def test_a_marker_left_by_a_killed_push_frees_itself_and_the_next_message_has_its_push(
    wa, run_jobs, cw, counted
):
    _chatwoot(wa["org"], cw)
    people = wa["customers"](1)
    org = wa["org"].pk
    # A worker killed -9 mid-push, its job gone (its last attempt): the marker lives on, no job runs.
    chatwoot_inbound.PENDING.wake(org, lambda: None)
    marker = chatwoot_inbound.PENDING.queued_key(org)
    # A hang guard, not a duration: the marker must free itself long before the queue's timeout.
    _wait(lambda: not jobs.get_connection().exists(marker), "the dead push's marker to expire", timeout=90)
    _batch(wa["org"], people, 0)
    assert counted["enqueued"] == 1  # no `recover` needed: the message enqueued its push
    run_jobs(["chatwoot-inbound"], settle=0)
    assert [m["content"] for m in cw.messages()] == [f"{people[0].pk} lote 0"]


def test_a_push_running_longer_than_its_markers_ttl_keeps_it_and_takes_what_is_written_meanwhile(
    wa, run_jobs, cw, counted, monkeypatch, settings
):
    _chatwoot(wa["org"], cw)
    # A marker of 3 s, kept every second: a margin a busy machine's scheduling does not eat (with
    # 1 s, kept every 0.33 s, a CI run under load once let it expire).
    monkeypatch.setattr(chatwoot_inbound, "PENDING", jobs.Pending("chatwoot-push", 3))
    settings.CHATWOOT_PUSH_CONCURRENCY = 1  # one conversation at a time: a push of several seconds
    cw.set_latency(600)  # 1.2 s a new contact: half-way is twice the marker's life
    people = wa["customers"](10)
    _batch(wa["org"], people, 0)

    def more() -> None:  # written once the push has run well past the marker's 3 s
        _wait(lambda: len(cw.messages()) >= 5, "the push to be half-way")
        _batch(wa["org"], people[:1], 1)

    _push_while_writing(run_jobs, more)
    assert counted["enqueued"] == 1, counted  # the running push's marker was alive all along
    theirs = [m["content"] for m in cw.messages() if m["content"].startswith(f"{people[0].pk} ")]
    assert theirs == [f"{people[0].pk} lote 0", f"{people[0].pk} lote 1"]
    assert len(cw.messages()) == 11


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


@pytest.mark.slow
def test_a_push_killed_with_its_worker_is_taken_over_within_a_minute_not_after_its_marker_expires(
    wa, worker_process
):
    """kill -9 mid-push leaves the organization's "queued" marker (TTL: the queue's timeout + 60 s)
    and its advisory lock's session; a message written meanwhile enqueues nothing. The next pool
    must deliver everything, each once and in order, well before the marker would expire."""
    with ChatwootSandbox(
        accounts={ACCOUNT_ID: CW_TOKEN}, inboxes={INBOX_ID: ACCOUNT_ID}, latency_ms=150
    ) as cw:
        _chatwoot(wa["org"], cw)
        people = wa["customers"](30)
        org = wa["org"].pk
        _batch(wa["org"], people, 0)
        # One conversation at a time (2 calls of 150 ms each for a new contact): still pushing
        # when the first message shows, however slow this process is to see it.
        workers = worker_process("--processes", "1", env=child_env(CHATWOOT_PUSH_CONCURRENCY="1"))
        _wait(lambda: cw.messages(), "the first message in Chatwoot", timeout=120)
        workers.kill()  # SIGKILL mid-push
        assert chatwoot_inbound.waiting().get(org, 0) > 0
        assert jobs.get_connection().exists(chatwoot_inbound.PENDING.queued_key(org))
        _batch(wa["org"], people[:1], 1)  # the dead push's marker lives on: no push is enqueued
        worker_process("--processes", "1")
        # A hang guard well under the marker's TTL (360 s): no duration is asserted beyond it.
        _wait(lambda: not chatwoot_inbound.waiting(), "every message in Chatwoot", timeout=150)
        for person in people:
            theirs = [m["content"] for m in cw.messages() if m["content"].startswith(f"{person.pk} ")]
            written = [f"{person.pk} lote 0"] + ([f"{person.pk} lote 1"] if person == people[0] else [])
            assert theirs == written  # each once, in order


def _statements(captured, table_op: str) -> int:
    return sum(1 for q in captured if q["sql"].startswith(table_op))


def test_a_push_reads_what_waits_when_told_and_writes_what_it_delivered_together(
    wa, run_jobs, cw, monkeypatch, settings
):
    """One customer's messages go one after another to a slow Chatwoot while a writer adds another
    customer's: the waiting rows are read at the start and once more when the writer says so (not
    every STREAM_POLL), every delivered row is written in one statement at the end (not one per
    conversation), and nothing delivered but not yet written is posted twice."""
    _chatwoot(wa["org"], cw)
    monkeypatch.setattr(chatwoot_inbound, "WRITE_EVERY", 3600.0)  # only "nothing in flight" writes
    settings.CHATWOOT_PUSH_CONCURRENCY = 1
    cw.set_latency(150)
    people = wa["customers"](6)
    for n in range(3):
        _batch(wa["org"], people[:5], n)  # 5 customers, 3 messages each: >= 15 calls of 150 ms

    def more() -> None:
        _wait(lambda: len(cw.messages()) >= 2, "the push to be under way")
        _batch(wa["org"], people[5:], 0)

    with CaptureQueriesContext(db_connection) as captured:
        _push_while_writing(run_jobs, more)
    sql = captured.captured_queries
    reads = _statements(sql, 'SELECT "messaging_conversationmessage"."id"')
    assert 1 <= reads <= 4, reads  # the start, the writer's batch (and a pass or job after it)
    assert _statements(sql, 'UPDATE "messaging_conversationmessage" SET "chatwoot_pending"') <= 3
    contents = [m["content"] for m in cw.messages()]
    assert len(contents) == len(set(contents)) == 16  # each once
    for person in people[:5]:
        assert [c for c in contents if c.startswith(f"{person.pk} ")] == [
            f"{person.pk} lote {n}" for n in range(3)
        ]


class _Killed(BaseException):
    """A worker dying between Chatwoot's answers and the push's write (what kill -9 does)."""


def test_messages_a_dead_push_posted_but_never_marked_are_found_not_posted_twice(wa, cw, monkeypatch):
    _chatwoot(wa["org"], cw)
    people = wa["customers"](3)
    for n in range(2):
        _batch(wa["org"], people, n)
    record = chatwoot_inbound._record

    def dying(outcomes):
        raise _Killed

    monkeypatch.setattr(chatwoot_inbound, "_record", dying)
    with pytest.raises(_Killed):
        chatwoot_inbound.push(organization_id=wa["org"].pk)
    assert len(cw.messages()) == 6  # Chatwoot has them all; the database says none was delivered
    assert set(ConversationMessage.objects.values_list("chatwoot_pending", "chatwoot_error")) == {
        (True, chatwoot_inbound.TAKEN)
    }
    monkeypatch.setattr(chatwoot_inbound, "_record", record)
    assert chatwoot_inbound.push(organization_id=wa["org"].pk) == 6
    contents = [m["content"] for m in cw.messages()]
    assert sorted(contents) == sorted(f"{p.pk} lote {n}" for p in people for n in range(2))  # each once
    assert not ConversationMessage.objects.filter(chatwoot_pending=True).exists()
