from __future__ import annotations

import threading
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from crm import fairshare, jobs
from runner import events, executions, items, operator
from runner.models import Execution, ExecutionItem
from tests.runner.conftest import processed


def _run(handler, org, n: int) -> Execution:
    jobs.get_connection().set("runner:test:produce", n)
    return executions.execution_start(handler=handler, organization_id=org.pk, trigger="manual")


def test_a_manual_run_processes_every_item_and_completes_once(py_handler, org, run_jobs):
    execution = _run(py_handler, org, 50)
    run_jobs()
    execution.refresh_from_db()
    assert execution.status == Execution.Status.COMPLETED
    assert (execution.items_total, execution.items_succeeded, execution.items_remaining) == (50, 50, 0)
    assert sorted(processed()) == sorted(f"e{i}" for i in range(50))
    assert jobs.get_connection().get(f"runner:completions:{execution.pk}") == b"1"
    assert not ExecutionItem.objects.exclude(status="succeeded").exists()


def test_a_worker_keeps_one_gate_and_one_lease_renewer_however_many_item_jobs_it_runs(
    py_handler, org, run_jobs
):
    # Every admitted item job holds a lease that one thread per process renews; a Gate per job
    # would leave its thread, and the Redis client it holds, behind for the life of the worker.
    def renewers() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "runner-leases")

    before = renewers()
    execution = _run(py_handler, org, 60)  # 6 item jobs
    run_jobs()
    execution.refresh_from_db()
    assert execution.status == Execution.Status.COMPLETED
    assert renewers() <= max(before, 1)
    assert items.gate() is items.gate()


def test_items_fan_out_on_the_priority_queue_of_their_trigger(py_handler, org):
    _run(py_handler, org, 3)
    from runner import tasks

    tasks.execution_run(Execution.objects.get().pk)
    conn = jobs.get_connection()
    queued = [jobs.fetch_job(j) for j in fairshare.queued_ids(conn, "items-p2")]  # manual = 2
    # An in-process handler's single items travel in groups: every item is in exactly one job.
    ids = [i for job in queued if job for i in job.kwargs["item_ids"]]
    assert sorted(ids) == sorted(ExecutionItem.objects.values_list("id", flat=True)) and len(ids) == 3
    assert fairshare.queued_ids(conn, "items-p5") == []


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
    out = StringIO()
    call_command("dlq_replay", "--handler", "crm-x/leads", stdout=out)
    assert out.getvalue() == "1 item reprocessado\n"
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
            wins.append(executions.settle(execution.pk, succeeded=1))
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
    assert operator.execution_cancel(execution=execution) == 5
    execution.refresh_from_db()
    assert (execution.status, execution.items_cancelled, execution.items_remaining) == ("cancelled", 5, 0)


def _paced(org, monkeypatch, limit: int = 600) -> None:
    """A tenant limit of `limit`/min fed in slices of limit/60 every second (the real pace is limit/10
    every 6 s: PACE_SLICES is only shortened so the test does not wait minutes)."""
    from runner.models import RunnerSettings

    RunnerSettings.objects.create(organization=org, rate_limit_per_minute=limit)
    monkeypatch.setattr(executions, "PACE_SLICES", 60)


def _events(n: int) -> list[dict]:
    return [{"external_id": f"ev{i}", "payload": {"i": i}} for i in range(n)]


def test_a_run_larger_than_a_minute_of_its_tenants_limit_is_fed_one_slice_at_a_time(
    py_handler, org, run_jobs, monkeypatch
):
    _paced(org, monkeypatch)
    execution = events.events_store(
        handler=py_handler, organization_id=org.pk, trigger="queue", events=_events(650)
    )
    conn = jobs.get_connection()
    first = list(
        ExecutionItem.objects.filter(execution=execution).order_by("id").values_list("id", flat=True)
    )
    execution.refresh_from_db()
    # Only the first slice (600/60 = 10 items, one group job) is queued; the feeder waits its turn.
    assert len(fairshare.queued_ids(conn, "items-p3")) == 1
    assert execution.fed_through == first[9]
    assert conn.zscore("rq:scheduled:items-p3", f"runner-feed-{execution.pk}") is not None
    # Backpressure: while the slice fed is still pending, the feeder adds nothing.
    with pytest.raises(jobs.Defer):
        executions.execution_feed(execution_id=execution.pk)
    assert len(fairshare.queued_ids(conn, "items-p3")) == 1

    # The feeder reads the limit at every slice: raised by the operator, the rest goes in one slice
    # (and the test does not wait the minute its 650 items are worth at 600/min).
    from runner.models import RunnerSettings

    settings_row = RunnerSettings.objects.get(organization=org)
    settings_row.rate_limit_per_minute = 600_000
    settings_row.save()
    run_jobs(["items-p3"], settle=1.5)
    execution.refresh_from_db()
    assert execution.status == Execution.Status.COMPLETED
    assert (execution.items_succeeded, execution.fed_through) == (650, first[-1])
    assert sorted(processed()) == sorted(f"ev{i}" for i in range(650))  # each exactly once


def test_recovery_gives_a_paced_run_back_its_feeder_not_every_pending_item(py_handler, org, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from crm import recovery

    _paced(org, monkeypatch)
    execution = events.events_store(
        handler=py_handler, organization_id=org.pk, trigger="queue", events=_events(700)
    )
    long_ago = timezone.now() - timedelta(minutes=5)
    Execution.objects.filter(pk=execution.pk).update(created_at=long_ago)
    ExecutionItem.objects.filter(execution=execution).update(created_at=long_ago)
    conn = jobs.get_connection()
    conn.flushdb()  # Redis loses everything

    recovery.recover()
    queued = [jobs.fetch_job(j) for j in fairshare.queued_ids(conn, "items-p3")]
    fed = [
        i for job in queued if job and job.func_name.endswith("items_process") for i in job.kwargs["item_ids"]
    ]
    execution.refresh_from_db()
    # The first slice's items get their job back and the feeder is back; the other 690 wait for it.
    assert sorted(fed) == list(
        ExecutionItem.objects.filter(execution=execution, id__lte=execution.fed_through).values_list(
            "id", flat=True
        )
    )
    assert len(fed) == 10
    feeder = [job for job in queued if job and job.id == f"runner-feed-{execution.pk}"]
    assert len(feeder) == 1 and feeder[0].meta["organization_id"] == org.pk  # for its log line


def test_a_small_tenants_run_is_served_beside_a_flooding_tenants_backlog_not_behind_it(integration, run_jobs):
    from crm.models import Organization
    from runner.models import Handler, RunnerSettings

    big = Organization.objects.create(name="Grande", slug="big")
    small = Organization.objects.create(name="Pequena", slug="small")
    RunnerSettings.objects.create(organization=big, rate_limit_per_minute=60_000)  # queued at once
    handler = Handler.objects.create(
        integration=integration,
        handler_key="shared",
        direction="inbound",
        kind=Handler.Kind.PYTHON,
        callable_path="tests.runner.handlers",
        organization=None,  # one handler serving every tenant
    )
    flood = events.events_store(
        handler=handler,
        organization_id=big.pk,
        trigger="queue",
        events=[{"external_id": f"big{i}", "payload": {}} for i in range(500)],
    )
    quiet = events.events_store(
        handler=handler,
        organization_id=small.pk,
        trigger="queue",
        events=[{"external_id": f"small{i}", "payload": {}} for i in range(10)],
    )
    assert flood is not None and quiet is not None
    run_jobs(["items-p3"])
    order = processed()
    assert sorted(order) == sorted([f"big{i}" for i in range(500)] + [f"small{i}" for i in range(10)])
    # The small tenant's items run in its first turn, beside the big tenant's first group of 10,
    # not after the 500 queued ahead of them.
    assert max(order.index(f"small{i}") for i in range(10)) < 30, order[:30]
    for execution in (flood, quiet):
        execution.refresh_from_db()
        assert execution.status == Execution.Status.COMPLETED
