"""Real worker processes: the pool, burst mode, and a killed worker's job noticed within seconds."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import pytest
from rq.command import send_shutdown_command
from rq.exceptions import StopRequested
from rq.job import JobStatus
from rq.worker import Worker, WorkerStatus

from crm import jobs, workers
from tests.conftest import recorded, wait_for
from tests.jobs import release

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_pool_of_processes_shares_the_work_and_burst_exits_when_done(worker_process):
    jobs.enqueue_many(
        "tests.jobs.record",
        queue="items-p2",
        kwargs_list=[{"key": "pool", "value": str(i)} for i in range(200)],
    )
    proc = worker_process("--processes", "2", "--burst")
    assert proc.wait(timeout=120) == 0
    assert sorted(recorded("pool"), key=int) == [str(i) for i in range(200)]


def test_burst_waits_for_a_retry_due_within_a_few_seconds(worker_process):
    job_id = jobs.enqueue("tests.jobs.fail", queue="whatsapp-send", kwargs={"key": "bf"})
    proc = worker_process("--burst")
    assert proc.wait(timeout=60) == 0
    assert recorded("bf") == ["attempt", "attempt"]  # the 1 s retry ran before burst exited
    assert jobs.fetch_job(job_id).get_status() == JobStatus.FAILED


def test_a_killed_workers_job_is_retried_within_seconds(worker_process):
    job_id = jobs.enqueue("tests.jobs.hold", queue="runs", kwargs={"key": "kill"})
    victim = worker_process("--queues", "runs")
    wait_for(lambda: len(recorded("kill")) == 1, timeout=120, what="the job to start")
    first_pid = recorded("kill")[0]
    victim.kill(signal.SIGKILL)
    killed_at = time.monotonic()
    # A healthy worker elsewhere notices the abandoned job and retries it (runs: 3 attempts, 5 s backoff).
    worker_process("--queues", "runs")
    # CRM_HEARTBEAT_TTL (10 s) + CRM_MAINTENANCE_INTERVAL (5 s) + the retry backoff (5 s) + process
    # start: about 25 s on an idle machine; the deadline is only a hang guard.
    wait_for(lambda: len(recorded("kill")) >= 2, timeout=240, what="the job to be retried")
    detected_after = time.monotonic() - killed_at
    print(f"killed worker's job running again {detected_after:.1f}s after SIGKILL")
    assert recorded("kill")[1] != first_pid
    job = jobs.fetch_job(job_id)
    assert job.retries_left == 1
    release("kill")


def test_a_worker_stops_warmly_on_sigterm_finishing_its_job(worker_process):
    jobs.enqueue("tests.jobs.sleep_and_record", queue="runs", kwargs={"key": "warm", "seconds": 2})
    proc = worker_process("--queues", "runs")
    wait_for(lambda: len(recorded("warm")) == 1, timeout=120, what="the job to start")
    proc.kill(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0  # a hang guard: the 2 s job finishes first
    assert recorded("warm")[-1] == "finished"


def test_a_stop_request_swallowed_on_its_way_still_stops_the_idle_worker(redis_db):
    # RQ raises StopRequested from the SIGTERM handler wherever an idle worker's main thread is;
    # an `except Exception` there (RQ's registry sweep, a logging handler) swallowed it, and the
    # worker ignored SIGTERM until a second one (seen twice on a busy machine).
    worker = workers.make_worker(["runs"])
    worker.register_birth()
    worker.heartbeat()
    worker.set_state(WorkerStatus.IDLE)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.suppress(Exception):  # what the code the signal interrupted does
            worker.request_stop(signal.SIGTERM, None)
        with pytest.raises(StopRequested):
            # Before: waited out its 20 idle seconds and returned None, to loop again in work().
            worker.dequeue_job_and_maintain_ttl(1, max_idle_time=20)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def test_a_worker_stops_on_sigterm_while_idle_and_its_pool_with_it(worker_process):
    single = worker_process("--queues", "runs")
    pool = worker_process("--queues", "runs", "--processes", "2")
    wait_for(lambda: len(Worker.all(connection=jobs.get_connection())) >= 3, timeout=120, what="workers up")
    single.kill(signal.SIGTERM)
    pool.kill(signal.SIGTERM)
    assert single.wait(timeout=120) == 0  # hang guards
    assert pool.wait(timeout=120) == 0


def test_a_warm_stop_is_not_held_by_a_command_listener_that_already_read_its_unsubscribe(redis_db):
    # At a warm stop RQ unsubscribes, then stops and joins its command listener. When the listener
    # read the unsubscribe answer before being told to stop, it went back to wait for a message
    # for its whole sleep (RQ's 60 s): a SIGTERM'd worker, its work done, stayed alive a minute
    # (a crash test's `wait(timeout=60)` failed on a busy CI).
    worker = workers.make_worker(["runs"])
    worker.subscribe()
    listener = worker.pubsub_thread
    worker.pubsub.unsubscribe()
    wait_for(lambda: not worker.pubsub.subscribed, timeout=60, what="the listener to read the unsubscribe")
    # Still running: it sleeps in get_message until it wakes and sees it is told to stop.
    assert listener.is_alive()
    stopping = threading.Thread(target=worker.unsubscribe, daemon=True)
    stopping.start()
    stopping.join(timeout=30)  # a hang guard, half RQ's sleep: the listener wakes within PUBSUB_WAKE
    assert not stopping.is_alive()
    assert not listener.is_alive()


def test_a_shutdown_sent_on_the_command_channel_stops_a_listening_worker(worker_process):
    proc = worker_process("--queues", "runs")
    connection = jobs.get_connection()

    def listening() -> list:  # its state is set once it has subscribed
        ready = (WorkerStatus.STARTED, WorkerStatus.IDLE)
        return [w for w in Worker.all(connection=connection) if w.get_state() in ready]

    wait_for(listening, timeout=120, what="the worker to listen")
    (worker,) = listening()
    send_shutdown_command(connection, worker.name)
    assert proc.wait(timeout=120) == 0  # a hang guard
