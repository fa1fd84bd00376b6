from __future__ import annotations

import threading

from django.core.management import call_command
from django.db import connection

from crm import jobs
from runner import services
from runner.models import Execution, ExecutionItem
from tests.runner.conftest import processed


def _run(handler, org, n: int) -> Execution:
    jobs.get_connection().set("runner:test:produce", n)
    return services.execution_start(handler=handler, organization_id=org.pk, trigger="manual")


def test_a_manual_run_processes_every_item_and_completes_once(py_handler, org, run_jobs):
    execution = _run(py_handler, org, 50)
    run_jobs()
    execution.refresh_from_db()
    assert execution.status == Execution.Status.COMPLETED
    assert (execution.items_total, execution.items_succeeded, execution.items_remaining) == (50, 50, 0)
    assert sorted(processed()) == sorted(f"e{i}" for i in range(50))
    assert jobs.get_connection().get(f"runner:completions:{execution.pk}") == b"1"
    assert not ExecutionItem.objects.exclude(status="succeeded").exists()


def test_items_fan_out_on_the_priority_queue_of_their_trigger(py_handler, org):
    _run(py_handler, org, 3)
    from runner import tasks

    tasks.execution_run(Execution.objects.get().pk)
    conn = jobs.get_connection()
    queued = [jobs.fetch_job(j.decode()) for j in conn.lrange("rq:queue:items-p2", 0, -1)]  # manual = 2
    # An in-process handler's single items travel in groups: every item is in exactly one job.
    ids = [i for job in queued if job for i in job.kwargs["item_ids"]]
    assert sorted(ids) == sorted(ExecutionItem.objects.values_list("id", flat=True)) and len(ids) == 3
    assert conn.llen("rq:queue:items-p5") == 0


def test_an_item_failing_twice_succeeds_on_its_third_attempt(py_handler, org, run_jobs, fast):
    jobs.get_connection().hset("runner:test:fail", "e1", 2)
    execution = _run(py_handler, org, 3)
    run_jobs()
    item = ExecutionItem.objects.get(external_id="e1")
    assert (item.status, item.attempts, item.dlq_at) == ("succeeded", 3, None)
    execution.refresh_from_db()
    assert execution.status == "completed" and execution.items_succeeded == 3


def test_an_item_failing_every_time_goes_to_the_dlq_after_three_attempts_and_replays(
    py_handler, org, run_jobs, fast
):
    conn = jobs.get_connection()
    conn.hset("runner:test:fail", "e0", 100)
    execution = _run(py_handler, org, 2)
    run_jobs()
    item = ExecutionItem.objects.get(external_id="e0")
    assert item.status == "failed" and item.attempts == 3 and item.dlq_at is not None
    assert item.last_error == "temporarily down"
    execution.refresh_from_db()
    assert (execution.status, execution.items_failed, execution.items_succeeded) == ("completed", 1, 1)
    assert "e0" not in processed()

    conn.delete("runner:test:fail")
    call_command("dlq_replay", "--handler", "crm-x/leads")
    execution.refresh_from_db()
    assert execution.status == "running" and execution.items_remaining == 1
    run_jobs()
    item.refresh_from_db()
    execution.refresh_from_db()
    assert (item.status, item.dlq_at, item.attempts) == ("succeeded", None, 4)
    assert (execution.status, execution.items_failed, execution.items_succeeded) == ("completed", 0, 2)
    assert conn.get(f"runner:completions:{execution.pk}") == b"2"  # completed again after the replay


def test_a_permanent_error_goes_to_the_dlq_at_once(py_handler, org, run_jobs):
    jobs.get_connection().sadd("runner:test:reject", "e2")
    _run(py_handler, org, 3)
    run_jobs()
    item = ExecutionItem.objects.get(external_id="e2")
    assert (item.status, item.attempts, item.last_error) == ("failed", 1, "rejected for good")


def test_the_fan_in_completes_exactly_once_under_concurrent_completions(py_handler, org):
    n = 40
    execution = Execution.objects.create(
        organization=org,
        integration=py_handler.integration,
        handler=py_handler,
        direction="inbound",
        trigger="manual",
        status="running",
        items_total=n,
        items_remaining=n,
    )
    wins: list[bool] = []
    barrier = threading.Barrier(n)

    def complete_one() -> None:
        try:
            barrier.wait()
            wins.append(services._settle(execution.pk, succeeded=1))
        finally:
            connection.close()

    threads = [threading.Thread(target=complete_one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    execution.refresh_from_db()
    assert wins.count(True) == 1
    assert (execution.status, execution.items_remaining, execution.items_succeeded) == ("completed", 0, n)


def test_cancel_leaves_no_pending_item_and_counts_them(py_handler, org):
    execution = _run(py_handler, org, 5)
    from runner import tasks

    tasks.execution_run(execution.pk)
    assert services.execution_cancel(execution=execution) == 5
    execution.refresh_from_db()
    assert (execution.status, execution.items_cancelled, execution.items_remaining) == ("cancelled", 5, 0)
