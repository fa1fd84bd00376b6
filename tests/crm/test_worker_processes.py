"""Real worker processes: the pool, burst mode, and a killed worker's job noticed within seconds."""

from __future__ import annotations

import signal
import time

import pytest
from rq.job import JobStatus

from crm import jobs
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
