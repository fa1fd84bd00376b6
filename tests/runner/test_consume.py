"""`manage.py runner_consume` against a real RabbitMQ: messages become items of a queue-triggered
execution (priority 3), and none is acknowledged before it is stored."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import pika
import pytest
from django.conf import settings
from hypothesis import HealthCheck, example, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from crm import fairshare, jobs, queues
from integrations.runner import amqp
from integrations.runner.amqp import Message
from runner.consumer import ACK_PAUSE_ENV, PAUSE_ENV, BatchConsumer, Poison, event_of
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
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"runner_consume still running after {timeout} s:\n{self.output()}")
        self._reader.join(timeout=5)
        return code

    def output(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def amqp_queue() -> Iterator[str]:
    name = f"runner.test.{uuid.uuid4().hex}"
    yield name
    amqp.queue_delete(URL, name)
    amqp.queue_delete(URL, amqp.dead_letter_queue(name))


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
        proc.popen.wait(timeout=60)


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
    conn = jobs.get_connection()  # item queues serve tenants in turn: jobs wait in tenants' lists
    queued = [jobs.fetch_job(j) for j in fairshare.queued_ids(conn, "items-p3")]
    assert sorted(i for job in queued if job for i in job.kwargs["item_ids"]) == sorted(i.pk for i in items)
    assert all(not fairshare.queued_ids(conn, queues.items_queue(p)) for p in (1, 2, 5))
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
    assert proc.saw("refused, dead-lettered: not JSON")
    assert proc.saw("refused, dead-lettered: the body is not UTF-8")
    assert list(ExecutionItem.objects.values_list("external_id", flat=True)) == ["c"]
    assert _ready(amqp_queue) == 0
    assert _ready(amqp.dead_letter_queue(amqp_queue)) == 2


def test_a_consumer_killed_before_storing_leaves_its_messages_unacknowledged_and_they_are_stored_once(
    py_handler, amqp_queue, consumer
):
    ids = _publish(amqp_queue, 30)
    first = consumer(amqp_queue, "--idle-exit", "30", env={PAUSE_ENV: "60"})
    wait_for(lambda: first.saw(PAUSE_ENV), timeout=30, what="the first batch received")
    assert _ready(amqp_queue) == 0  # delivered to the consumer, unacknowledged
    first.signal(signal.SIGKILL)
    first.wait(timeout=60)

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
    first.wait(timeout=60)
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
    # The intake's parser refuses it before the database would (a NUL anywhere is poison).
    assert proc.saw("refused, dead-lettered: the body.nul contains a NUL character"), proc.output()
    assert sorted(ExecutionItem.objects.values_list("external_id", flat=True)) == ["ok1", "ok3"]
    assert _ready(amqp_queue) == 0


def _payloads(**filters: object) -> Counter[str]:
    """The stored items' payloads, as canonical JSON, with how often each is stored."""
    rows = ExecutionItem.objects.filter(**filters).values_list("payload", flat=True)
    return Counter(json.dumps(p, sort_keys=True) for p in rows)


def _body(**payload: object) -> bytes:
    return json.dumps(payload, sort_keys=True).encode()


def test_a_batch_whose_last_message_is_not_json_is_settled_and_the_channel_stays_open(
    py_handler, amqp_queue, consumer
):
    """The dropped message's tag is not acknowledged again (RabbitMQ would close the channel with
    406 PRECONDITION_FAILED, and the consumer would receive nothing more)."""
    amqp.publish(URL, amqp_queue, [b'{"n": 1}', b"not json"], message_ids=["j1", "p1"])
    proc = consumer(amqp_queue, "--max-messages", "3", "--idle-exit", "30")
    wait_for(lambda: proc.saw("batch: "), timeout=60, what="the first batch stored")
    amqp.publish(URL, amqp_queue, [b'{"n": 2}'], message_ids=["j2"])
    assert proc.wait(timeout=90) == 0, proc.output()
    assert not proc.saw("PRECONDITION_FAILED"), proc.output()
    assert not proc.saw("lost the consumer"), proc.output()
    assert sorted(ExecutionItem.objects.values_list("external_id", flat=True)) == ["j1", "j2"]
    assert proc.saw("2 stored, 1 dropped, 0 already stored"), proc.output()
    assert _ready(amqp_queue) == 0


KINDS = ["json", "resend", "idless", "twin", "poison", "refused"]


@st.composite
def _mixes(draw: st.DrawFn) -> tuple[list[str], int, int]:
    return (
        draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=14)),
        draw(st.integers(1, 6)),  # batch
        draw(st.integers(0, 4)),  # prefetch beyond the batch
    )


@examples(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mix=_mixes())
@example(mix=(["json", "poison"], 2, 0))  # the production case: a batch ending in a non-JSON body
@example(mix=(["poison", "json", "refused", "idless", "poison"], 5, 0))
def test_any_mix_of_messages_in_any_batch_size_is_stored_once_and_settled_without_a_channel_error(
    py_handler, mix
):
    """JSON messages with an id (some resent), id-less ones (some the same body twice), bodies that
    are not JSON and JSON the database refuses, in batches of 1-6, through the real broker: the
    queue ends empty, the channel is never lost, every JSON message is stored exactly once (an
    id-less body sent twice is two messages), everything else is dropped."""
    kinds, batch, extra = mix
    run = uuid.uuid4().hex[:12]
    queue = f"runner.test.mix.{run}"
    bodies: list[bytes] = []
    ids: list[str] = []
    expected: Counter[str] = Counter()
    sent_with_id: list[int] = []
    sent_without: list[int] = []
    dropped = resent = 0
    for k, kind in enumerate(kinds):
        if kind == "resend" and sent_with_id:
            original = sent_with_id[k % len(sent_with_id)]
            bodies.append(bodies[original])
            ids.append(ids[original])
            resent += 1
            continue
        if kind == "twin" and sent_without:
            bodies.append(bodies[sent_without[k % len(sent_without)]])
            ids.append("")
            expected[bodies[-1].decode()] += 1
            continue
        if kind == "poison":
            bodies.append(f"not json {run} {k}".encode())
            ids.append(f"{run}-{k}")
            dropped += 1
            continue
        if kind == "refused":  # jsonb refuses a NUL character
            bodies.append(_body(run=run, k=k, nul="\u0000"))
            ids.append(f"{run}-{k}")
            dropped += 1
            continue
        bodies.append(_body(run=run, k=k, id=f"order-{k % 3}"))
        expected[bodies[-1].decode()] += 1
        if kind in ("json", "resend"):
            ids.append(f"{run}-{k}")
            sent_with_id.append(k)
        else:
            ids.append("")
            sent_without.append(k)
    amqp.publish(URL, queue, bodies, message_ids=ids)
    loop = BatchConsumer(
        handler=py_handler,
        organization_id=py_handler.organization_id,
        url=URL,
        queue=queue,
        prefetch=batch + extra,
        batch=batch,
        max_messages=len(bodies),
        idle_exit=10,
        reconnect_for=0,
    )
    try:
        tally = loop.run()
        left = _ready(queue)
    finally:
        amqp.queue_delete(URL, queue)
    assert tally.reconnects == 0  # the channel was never closed under the consumer
    assert left == 0
    assert _payloads(payload__run=run) == expected
    assert (tally.handled, tally.stored, tally.dropped, tally.duplicates) == (
        len(bodies),
        sum(expected.values()),
        dropped,
        resent,
    )


def _rabbitmqctl(*args: str) -> list[list[str]]:
    if not shutil.which("rabbitmqctl"):
        pytest.fail("rabbitmqctl is not installed (Debian's rabbitmq-server has it)")
    out = subprocess.run(
        ["rabbitmqctl", *args, "-q"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return [line.split("\t") for line in out.splitlines() if line.strip()]


def _consumer_connections(queue: str) -> list[str]:
    """The broker's ids of the connections consuming `queue` (through their channels)."""
    channels = {
        row[1] for row in _rabbitmqctl("list_consumers", "queue_name", "channel_pid") if row[0] == queue
    }
    return sorted(
        {row[1] for row in _rabbitmqctl("list_channels", "pid", "connection") if row[0] in channels}
    )


def _broker_is_local() -> bool:
    return urllib.parse.urlsplit(URL).hostname in ("127.0.0.1", "localhost", "::1")


# rabbitmqctl reaches the local node only; like the other AMQP tests, this one fails rather than
# skips when the local broker's tools are missing (scripts/test installs Debian's rabbitmq-server).
@pytest.mark.skipif(
    not _broker_is_local(), reason="the broker is not on this machine: rabbitmqctl cannot reach it"
)
def test_a_connection_the_broker_closes_is_reopened_and_nothing_is_lost_or_stored_twice(
    py_handler, amqp_queue, consumer
):
    """The broker closes the consumer's connection after its batch is stored and before it is
    acknowledged: the consumer reconnects, the redelivered messages (with and without message_id)
    are recognised as stored, and messages published afterwards are consumed."""
    _publish(amqp_queue, 3, prefix="c")
    idless = [
        _body(id="order-1", status="new"),
        _body(id="order-1", status="paid"),  # the same record changed: another event
        _body(lead="Ana"),
        _body(lead="Ana"),  # the same body published twice without an id: two messages
    ]
    amqp.publish(URL, amqp_queue, idless)
    proc = consumer(amqp_queue, "--max-messages", "9", "--idle-exit", "90", env={ACK_PAUSE_ENV: "300"})
    wait_for(lambda: proc.saw(ACK_PAUSE_ENV), timeout=60, what="the first batch stored")
    assert ExecutionItem.objects.count() == 7
    connections = _consumer_connections(amqp_queue)
    assert len(connections) == 1
    _rabbitmqctl("close_connection", connections[0], "test: broker closes")
    amqp.publish(URL, amqp_queue, [_body(after=1), _body(after=2)], message_ids=["after-1", ""])
    assert proc.wait(timeout=120) == 0, proc.output()
    assert proc.saw("CONNECTION_FORCED"), proc.output()
    assert proc.saw("9 stored, 0 dropped, 7 already stored"), proc.output()
    assert _payloads() == Counter(
        {json.dumps({"n": i}): 1 for i in range(3)}
        | {b.decode(): idless.count(b) for b in idless}
        | {_body(after=1).decode(): 1, _body(after=2).decode(): 1}
    )
    assert _ready(amqp_queue) == 0


def test_a_consumer_whose_queue_is_deleted_declares_it_again_and_goes_on_consuming(
    py_handler, amqp_queue, consumer
):
    """The broker cancels the consumer of a deleted queue; before, the process stayed up consuming nothing."""
    ids = _publish(amqp_queue, 2)
    proc = consumer(amqp_queue, "--max-messages", "3", "--idle-exit", "60")
    wait_for(lambda: ExecutionItem.objects.count() == 2, timeout=60, what="the first messages stored")
    amqp.queue_delete(URL, amqp_queue)
    amqp.publish(URL, amqp_queue, [b'{"n": 9}'], message_ids=["after"])
    wait_for(lambda: ExecutionItem.objects.count() == 3, timeout=90, what="consuming resumed")
    assert proc.wait(timeout=90) == 0, proc.output()
    assert proc.saw("cancelled the consumer"), proc.output()
    assert sorted(ExecutionItem.objects.values_list("external_id", flat=True)) == sorted([*ids, "after"])
    assert _ready(amqp_queue) == 0


class TcpProxy:
    """A loopback TCP forwarder to the broker whose connections a test can cut (`drop`) or refuse
    for good (`close`)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = ""
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _addr = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def drop(self) -> None:
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accepting thread; close() alone would not
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.drop()


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    parsed = urllib.parse.urlsplit(URL)
    server = TcpProxy(parsed.hostname or "127.0.0.1", parsed.port or 5672)
    server.url = urllib.parse.urlunsplit(
        parsed._replace(netloc=f"{parsed.netloc.rsplit('@', 1)[0]}@127.0.0.1:{server.port}")
    )
    yield server
    server.close()


def test_a_dropped_connection_is_reopened_and_consuming_resumes(py_handler, amqp_queue, consumer, proxy):
    ids = _publish(amqp_queue, 2)
    proc = consumer(amqp_queue, "--amqp-url", proxy.url, "--idle-exit", "60")
    wait_for(lambda: ExecutionItem.objects.count() == 2, timeout=60, what="the first messages stored")
    proxy.drop()  # the network cuts the connection
    amqp.publish(URL, amqp_queue, [b'{"n": 9}'], message_ids=["after"])
    # The cut may land between a batch's commit and its acknowledgement: the broker then delivers
    # m0 and m1 again, and they are recognised as already stored (not counted by the items below).
    wait_for(
        lambda: ExecutionItem.objects.filter(external_id="after").exists(),
        timeout=90,
        what="the message published after the cut",
    )
    wait_for(lambda: _ready(amqp_queue) == 0, timeout=30, what="the queue to be drained")
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.output()
    assert proc.saw("lost the consumer") and proc.saw("reconnected"), proc.output()
    assert sorted(ExecutionItem.objects.values_list("external_id", flat=True)) == sorted([*ids, "after"])
    assert _ready(amqp_queue) == 0


def test_a_broker_that_stays_away_ends_the_consumer_non_zero_saying_why(
    py_handler, amqp_queue, consumer, proxy
):
    ids = _publish(amqp_queue, 2)
    proc = consumer(amqp_queue, "--amqp-url", proxy.url, "--reconnect-for", "2", "--idle-exit", "120")
    wait_for(lambda: ExecutionItem.objects.count() == 2, timeout=60, what="the first messages stored")
    proxy.close()  # the broker is gone for good
    assert proc.wait(timeout=90) == 1, proc.output()
    assert proc.saw("cannot consume") and proc.saw("again after 2 s"), proc.output()
    assert sorted(ExecutionItem.objects.values_list("external_id", flat=True)) == sorted(ids)
    # The cut may have landed between the batch's commit and its acknowledgement: the broker then
    # holds m0 and m1 again. A consumer started later recognises them and stores nothing twice.
    later = consumer(amqp_queue, "--idle-exit", "2")
    assert later.wait(timeout=90) == 0, later.output()
    assert sorted(ExecutionItem.objects.values_list("external_id", flat=True)) == sorted(ids)
    assert _ready(amqp_queue) == 0


def test_an_id_less_message_redelivered_after_it_was_stored_is_not_stored_again(
    py_handler, amqp_queue, consumer
):
    """Without a message_id the body's hash recognises a redelivery (the broker marks it
    redelivered); a first delivery of the same body is a new message and is stored."""
    bodies = [
        _body(id="order-7", status="new"),
        _body(id="order-7", status="paid"),
        _body(lead="Ana"),
        _body(lead="Ana"),
    ]
    amqp.publish(URL, amqp_queue, bodies)
    first = consumer(amqp_queue, "--idle-exit", "30", env={ACK_PAUSE_ENV: "120"})
    wait_for(lambda: first.saw(ACK_PAUSE_ENV), timeout=60, what="the first batch stored")
    first.signal(signal.SIGKILL)
    first.wait(timeout=60)
    assert ExecutionItem.objects.count() == 4
    wait_for(lambda: _ready(amqp_queue) == 4, timeout=15, what="the unacknowledged messages requeued")
    amqp.publish(URL, amqp_queue, [_body(lead="Ana")])  # published again, later: a new message

    second = consumer(amqp_queue, "--max-messages", "5", "--idle-exit", "30")
    assert second.wait(timeout=90) == 0, second.output()
    assert second.saw("1 stored, 0 dropped, 4 already stored"), second.output()
    assert _payloads() == Counter(
        {_body(id="order-7", status="new").decode(): 1, _body(id="order-7", status="paid").decode(): 1}
        | {_body(lead="Ana").decode(): 3}
    )
    assert _ready(amqp_queue) == 0


def test_long_message_ids_are_compared_whole_not_cut_to_the_column(py_handler, amqp_queue, consumer):
    """Two message ids that share their first 200 characters are two messages."""
    from runner.models import WebhookEvent

    prefix = "m" * 240
    amqp.publish(
        URL,
        amqp_queue,
        [b'{"n": 1}', b'{"n": 2}', b'{"n": 1}'],
        message_ids=[prefix + "-a", prefix + "-b", prefix + "-a"],
    )
    proc = consumer(amqp_queue, "--max-messages", "3", "--idle-exit", "30")
    assert proc.wait(timeout=90) == 0, proc.output()
    assert proc.saw("2 stored, 0 dropped, 1 already stored"), proc.output()
    assert _payloads() == Counter({'{"n": 1}': 1, '{"n": 2}': 1})
    recorded = list(WebhookEvent.objects.values_list("event_id", flat=True))
    assert len(set(recorded)) == 2 and all(len(i) <= 200 for i in recorded)
    assert _ready(amqp_queue) == 0


# --- what real publishers send: poison is dead-lettered, an operator's queue adopted ---------

DEEP = ("[" * 1000 + "]" * 1000).encode()  # 2 KB, nested 1,000 levels


def _gzip_bomb() -> bytes:
    """~64 KB that inflate to 64 MB."""
    return gzip.compress(b"{" + b" " * (64 * 1024 * 1024) + b"}", compresslevel=9)


def _stored() -> list[str]:
    return sorted(ExecutionItem.objects.values_list("external_id", flat=True))


def _dead_letters(queue: str) -> list[str]:
    """The message ids waiting on `queue` (read and left there)."""
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    try:
        channel = connection.channel()
        ids = []
        while True:
            method, props, _body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            ids.append(props.message_id)
        return sorted(ids)
    finally:
        connection.close()


def test_deep_compressed_and_mis_encoded_bodies_are_dead_lettered_and_the_rest_stored(
    py_handler, amqp_queue, consumer
):
    amqp.publish(URL, amqp_queue, [DEEP, b'{"plain": 1}'], message_ids=["deep", "plain"])
    amqp.publish(
        URL, amqp_queue, [_gzip_bomb(), b"not gzip"], message_ids=["bomb", "corrupt"], content_encoding="gzip"
    )
    amqp.publish(
        URL, amqp_queue, [gzip.compress(b'{"zipped": true}')], message_ids=["zipped"], content_encoding="gzip"
    )
    amqp.publish(URL, amqp_queue, [b'{"br": 1}'], message_ids=["br"], content_encoding="br")
    amqp.publish(URL, amqp_queue, [b'{"late": 1}'], message_ids=["late"])
    proc = consumer(amqp_queue, "--idle-exit", "2")
    assert proc.wait(timeout=120) == 0, proc.output()
    assert _stored() == ["late", "plain", "zipped"]
    assert ExecutionItem.objects.get(external_id="zipped").payload == {"zipped": True}
    assert _ready(amqp_queue) == 0  # every message settled: nothing left to crash a restart
    assert _dead_letters(amqp.dead_letter_queue(amqp_queue)) == ["bomb", "br", "corrupt", "deep"]
    assert proc.saw("nested deeper than 32 levels")
    assert proc.saw("larger than 1048576 bytes once decompressed")
    assert proc.saw("unknown content_encoding 'br'")


def test_a_64_mb_message_is_dead_lettered_and_the_next_one_stored(py_handler, amqp_queue, consumer):
    amqp.publish(URL, amqp_queue, [b"[" + b"0," * (32 * 1024 * 1024) + b"0]"], message_ids=["huge"])
    amqp.publish(URL, amqp_queue, [b'{"after": 1}'], message_ids=["after"])
    proc = consumer(amqp_queue, "--idle-exit", "2", "--prefetch", "1")
    assert proc.wait(timeout=180) == 0, proc.output()
    assert _stored() == ["after"]
    assert _dead_letters(amqp.dead_letter_queue(amqp_queue)) == ["huge"]
    assert proc.saw("is larger than 1048576 bytes")


@pytest.fixture
def operators_queue() -> Iterator[tuple[str, str]]:
    """A queue declared by its operator with a dead-letter exchange of their own, and its DLQ."""
    name = f"runner.test.{uuid.uuid4().hex}"
    exchange, dlq = f"{name}.dlx", f"{name}.their-dlq"
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    channel = connection.channel()
    channel.exchange_declare(exchange, exchange_type="fanout", durable=True)
    channel.queue_declare(dlq, durable=True)
    channel.queue_bind(dlq, exchange)
    channel.queue_declare(name, durable=True, arguments={"x-dead-letter-exchange": exchange})
    connection.close()
    yield name, dlq
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    channel = connection.channel()
    for queue in (name, dlq, amqp.dead_letter_queue(name)):
        channel.queue_delete(queue)
    channel.exchange_delete(exchange)
    connection.close()


def test_a_queue_its_operator_declared_with_a_dead_letter_exchange_is_adopted(
    py_handler, operators_queue, consumer
):
    queue, their_dlq = operators_queue
    amqp.publish(URL, queue, [b"{broken", b'{"ok": 1}'], message_ids=["broken", "ok"])
    proc = consumer(queue, "--idle-exit", "2")
    assert proc.wait(timeout=60) == 0, proc.output()  # not 406 PRECONDITION_FAILED
    assert _stored() == ["ok"]
    assert _dead_letters(their_dlq) == ["broken"]
    assert _ready(queue) == 0


def _nested(depth: int) -> bytes:
    return ('{"a":' * depth + "1" + "}" * depth).encode()


@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.builds(_nested, st.integers(min_value=0, max_value=3000)),
        st.builds(lambda b: gzip.compress(b), st.binary(max_size=300)),
        st.builds(
            lambda v: json.dumps(v).encode(), st.recursive(st.none() | st.floats() | st.text(), st.lists)
        ),
    ),
    encoding=st.sampled_from(["", "identity", "gzip", "GZIP", "x-gzip", "deflate", "br", "\x00"]),
)
def test_any_body_in_any_encoding_is_an_event_or_poison_never_an_error(body: bytes, encoding: str) -> None:
    message = Message(delivery_tag=1, body=body, message_id="", redelivered=False, content_encoding=encoding)
    try:
        event = event_of(message, max_bytes=4096)
    except Poison:
        return
    json.dumps(event["payload"], allow_nan=False)  # storable as jsonb
