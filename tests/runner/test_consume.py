"""`manage.py runner_consume` against a real RabbitMQ: messages become items of a queue-triggered
execution (priority 3), and none is acknowledged before it is stored."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import pika
import pytest
from django.conf import settings

from crm import jobs, queues
from integrations.runner import amqp
from runner.management.commands.runner_consume import ACK_PAUSE_ENV, PAUSE_ENV
from runner.models import Execution, ExecutionItem
from tests.conftest import ROOT, child_env, wait_for
from tests.runner.conftest import processed

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

URL = settings.AMQP_URL


def _reachable() -> bool:
    try:
        pika.BlockingConnection(pika.URLParameters(URL)).close()
    except Exception:
        return False
    return True


if not _reachable():  # pragma: no cover
    if os.environ.get("CRM_SKIP_AMQP_TESTS") == "1":
        pytest.skip(f"RabbitMQ is not reachable at {URL} (CRM_SKIP_AMQP_TESTS=1)", allow_module_level=True)
    raise pytest.UsageError(
        f"RabbitMQ is not reachable at {URL}: `make test` installs and starts it when run as root; "
        "else start one (or set AMQP_URL), or skip these tests with CRM_SKIP_AMQP_TESTS=1"
    )


class Consumer:
    """`manage.py runner_consume` in its own process group; its output is collected line by line."""

    def __init__(self, queue: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self.popen = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "runner_consume",
                "crm-x",
                "leads",
                "--queue",
                queue,
                *args,
            ],
            cwd=ROOT,
            env=child_env(**{"LANGUAGE_CODE": "en", **(env or {})}),  # the test reads its words
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def wait(self, timeout: float = 60) -> int:
        code = self.popen.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def output(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def amqp_queue() -> Iterator[str]:
    name = f"runner.test.{uuid.uuid4().hex}"
    yield name
    amqp.queue_delete(URL, name)


@pytest.fixture
def consumer() -> Iterator[Callable[..., Consumer]]:
    started: list[Consumer] = []

    def _start(queue: str, *args: str, env: dict[str, str] | None = None) -> Consumer:
        proc = Consumer(queue, *args, env=env)
        started.append(proc)
        return proc

    yield _start
    for proc in started:
        proc.signal(signal.SIGKILL)
        proc.popen.wait(timeout=10)


def _publish(queue: str, n: int, prefix: str = "m") -> list[str]:
    ids = [f"{prefix}{i}" for i in range(n)]
    amqp.publish(URL, queue, [json.dumps({"n": i}).encode() for i in range(n)], message_ids=ids)
    return ids


def _ready(queue: str) -> int:
    return amqp.queue_counts(URL, queue)[0]


def test_messages_become_items_of_a_queue_execution_on_priority_3_and_a_worker_processes_them(
    py_handler, amqp_queue, consumer, run_jobs
):
    ids = _publish(amqp_queue, 5)
    # No message_id: the JSON `id` field is the external id.
    amqp.publish(URL, amqp_queue, [json.dumps({"id": "evt-json", "lead": "Ana"}).encode()])
    proc = consumer(amqp_queue, "--idle-exit", "2")
    assert proc.wait() == 0, proc.output()
    assert proc.saw("batch: ")

    items = ExecutionItem.objects.select_related("execution")
    assert sorted(i.external_id for i in items) == sorted([*ids, "evt-json"])
    assert {i.execution.trigger for i in items} == {"queue"}
    assert items.get(external_id="m3").payload == {"n": 3}
    assert items.get(external_id="evt-json").payload == {"id": "evt-json", "lead": "Ana"}
    # The item jobs wait on the queue trigger's priority queue, and only there.
    assert queues.items_queue(queues.JOB_PRIORITY["queue"]) == "items-p3"
    queued = jobs.get_queue("items-p3").get_jobs()
    assert sorted(i for job in queued for i in job.kwargs["item_ids"]) == sorted(i.pk for i in items)
    assert all(jobs.get_queue(queues.items_queue(p)).count == 0 for p in (1, 2, 5))
    assert _ready(amqp_queue) == 0  # all acknowledged

    run_jobs()
    assert sorted(processed()) == sorted([*ids, "evt-json"])
    assert ExecutionItem.objects.filter(status="succeeded").count() == 6
    assert not Execution.objects.exclude(status="completed").exists()


def test_a_body_that_is_not_json_is_dropped_not_stored_and_not_requeued(py_handler, amqp_queue, consumer):
    amqp.publish(
        URL, amqp_queue, [b"not json at all", b"\xff\xfe", b'{"ok": 1}'], message_ids=["a", "b", "c"]
    )
    proc = consumer(amqp_queue, "--idle-exit", "2")
    assert proc.wait() == 0, proc.output()
    assert proc.saw("is not JSON: dropped")
    assert list(ExecutionItem.objects.values_list("external_id", flat=True)) == ["c"]
    assert _ready(amqp_queue) == 0


def test_a_consumer_killed_before_storing_leaves_its_messages_unacknowledged_and_they_are_stored_once(
    py_handler, amqp_queue, consumer
):
    ids = _publish(amqp_queue, 30)
    first = consumer(amqp_queue, "--idle-exit", "30", env={PAUSE_ENV: "60"})
    wait_for(lambda: first.saw(PAUSE_ENV), timeout=30, what="the first batch received")
    assert _ready(amqp_queue) == 0  # delivered to the consumer, unacknowledged
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)

    assert not ExecutionItem.objects.exists()
    wait_for(lambda: _ready(amqp_queue) == 30, timeout=15, what="the unacknowledged messages requeued")

    second = consumer(amqp_queue, "--idle-exit", "2", "--batch", "7")
    assert second.wait() == 0, second.output()
    counts = Counter(ExecutionItem.objects.values_list("external_id", flat=True))
    assert counts == Counter(ids)  # each exactly once
    assert Execution.objects.filter(trigger="queue").count() >= 30 // 7
    assert _ready(amqp_queue) == 0


def test_a_consumer_killed_after_storing_but_before_acknowledging_stores_nothing_twice(
    py_handler, amqp_queue, consumer, run_jobs
):
    """The broker redelivers what was never acknowledged, stored or not: the message ids recorded
    with the items recognise the redelivery, which is acknowledged and not stored again."""
    ids = _publish(amqp_queue, 20)
    first = consumer(amqp_queue, "--idle-exit", "30", env={ACK_PAUSE_ENV: "60"})
    wait_for(lambda: first.saw(ACK_PAUSE_ENV), timeout=30, what="the first batch stored")
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert Counter(ExecutionItem.objects.values_list("external_id", flat=True)) == Counter(ids)
    wait_for(lambda: _ready(amqp_queue) == 20, timeout=15, what="the unacknowledged messages requeued")

    second = consumer(amqp_queue, "--idle-exit", "2", "--batch", "7")
    assert second.wait() == 0, second.output()
    assert second.saw("0 stored, 0 dropped, 20 already stored"), second.output()
    assert Counter(ExecutionItem.objects.values_list("external_id", flat=True)) == Counter(ids)
    assert _ready(amqp_queue) == 0
    run_jobs()
    assert sorted(processed()) == sorted(ids)  # the handler saw each message once


def test_a_publishers_resend_is_acknowledged_and_stored_once(py_handler, amqp_queue, consumer):
    ids = _publish(amqp_queue, 5)
    amqp.publish(  # m1 and m3 again (a publisher that lost its confirms), and one new message
        URL, amqp_queue, [b'{"n": 1}', b'{"n": 3}', b'{"n": 5}'], message_ids=["m1", "m3", "m5"]
    )
    # Without a message_id the JSON id labels the item but names a record, not the event: two
    # messages about order 7 are two events, both stored.
    amqp.publish(URL, amqp_queue, [b'{"id": "order-7"}', b'{"id": "order-7", "status": "paid"}'])
    proc = consumer(amqp_queue, "--idle-exit", "2", "--batch", "4")
    assert proc.wait() == 0, proc.output()
    assert proc.saw("8 stored, 0 dropped, 2 already stored"), proc.output()
    assert Counter(ExecutionItem.objects.values_list("external_id", flat=True)) == Counter(
        [*ids, "m5", "order-7", "order-7"]
    )
    assert _ready(amqp_queue) == 0


def test_sigterm_stops_consuming_but_finishes_the_current_batch(py_handler, amqp_queue, consumer):
    ids = _publish(amqp_queue, 20)
    proc = consumer(amqp_queue, "--batch", "8", env={PAUSE_ENV: "2"})
    wait_for(lambda: proc.saw(PAUSE_ENV), timeout=30, what="a batch received")
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, proc.output()

    stored = list(ExecutionItem.objects.values_list("external_id", flat=True))
    assert len(stored) == 8 and len(set(stored)) == 8  # the batch in hand, stored once
    assert set(stored) <= set(ids)
    assert _ready(amqp_queue) == 12  # the rest is back in the queue, unacknowledged
    assert proc.saw("stopped: 8 messages handled, 8 stored, 0 dropped, 0 already stored")


def test_max_messages_stops_after_that_many(py_handler, amqp_queue, consumer):
    _publish(amqp_queue, 10)
    proc = consumer(amqp_queue, "--max-messages", "4", "--batch", "3")
    assert proc.wait() == 0, proc.output()
    assert ExecutionItem.objects.count() == 4
    assert Execution.objects.count() == 2  # 3 + 1
    assert _ready(amqp_queue) == 6


def test_a_batch_the_database_fails_to_store_is_requeued_and_stored_once_later(
    py_handler, amqp_queue, consumer
):
    from django.db import connection

    ids = _publish(amqp_queue, 10)
    proc = consumer(amqp_queue, "--idle-exit", "4", env={PAUSE_ENV: "1"})
    wait_for(lambda: proc.saw(PAUSE_ENV), timeout=30, what="a batch received")
    with connection.cursor() as cursor:  # the table is gone for a while: every store fails
        cursor.execute("ALTER TABLE runner_execution RENAME TO runner_execution_away")
    try:
        wait_for(lambda: proc.saw("failed, requeued"), timeout=30, what="the failed batch requeued")
        assert not ExecutionItem.objects.exists()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE runner_execution_away RENAME TO runner_execution")
    assert proc.wait() == 0, proc.output()
    assert Counter(ExecutionItem.objects.values_list("external_id", flat=True)) == Counter(ids)
    assert _ready(amqp_queue) == 0


def test_a_message_the_database_refuses_is_isolated_and_dropped_the_others_are_stored(
    py_handler, amqp_queue, consumer
):
    bodies = [b'{"n": 1}', b'{"nul": "\\u0000"}', b'{"n": 3}']  # jsonb refuses a NUL character
    amqp.publish(URL, amqp_queue, bodies, message_ids=["ok1", "bad", "ok3"])
    proc = consumer(amqp_queue, "--idle-exit", "2")
    assert proc.wait() == 0, proc.output()
    assert proc.saw("refused by the database: dropped"), proc.output()
    assert sorted(ExecutionItem.objects.values_list("external_id", flat=True)) == ["ok1", "ok3"]
    assert _ready(amqp_queue) == 0
