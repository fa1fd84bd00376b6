from __future__ import annotations

import threading
import time
from typing import Any

from crm import fairshare, jobs, prometheus, resilience
from crm.models import Organization
from crm.resilience import BreakerPolicy, Gate
from runner import cache, executions, operator, tasks
from runner.models import ExecutionItem, Handler, RunnerSettings
from tests.runner.conftest import processed

# Windows on Redis's clock: long enough that a loaded machine's pauses between two calls (a second
# or more) never cross one by accident; the tests sleep past them, never measure them.
POLICY = BreakerPolicy(failures=5, open_ms=2000, successes=2, probes=1)
OPEN_OVER = 2.05  # seconds: POLICY's open time is over


def _admit(gate: Gate, **kw):
    args: dict[str, Any] = dict(
        integration_key="ik", handler_id=1, organization_id=1, tenant_limit=1000, concurrency=100
    )
    args.update(kw)
    return gate.admit(policy=POLICY, **args)


def _call(gate: Gate, outcome: str):
    a = _admit(gate)
    if a.admitted:
        gate.finish(a, integration_key="ik", handler_id=1, outcome=outcome, policy=POLICY)
    return a


def test_the_breaker_opens_after_five_failures_half_opens_after_the_timeout_and_closes_after_two_probes():
    gate = Gate(jobs.get_connection())
    for _ in range(4):
        _call(gate, "failure")
    assert gate.breaker_state("ik")["state"] == "closed"
    _call(gate, "failure")
    assert gate.breaker_state("ik")["state"] == "open"
    refused = _admit(gate)
    assert not refused.admitted and refused.code == resilience.CIRCUIT_OPEN
    assert 0 < refused.wait <= 2.0  # waits until the half-open probe, no longer
    time.sleep(OPEN_OVER)
    probe = _admit(gate)
    assert probe.admitted and probe.probe
    second = _admit(gate)
    assert not second.admitted and second.code == resilience.HALF_OPEN_BUSY
    gate.finish(probe, integration_key="ik", handler_id=1, outcome="success", policy=POLICY)
    assert gate.breaker_state("ik")["state"] == "half"
    _call(gate, "success")
    assert gate.breaker_state("ik")["state"] == "closed"


def test_a_failure_in_half_open_reopens_the_circuit():
    gate = Gate(jobs.get_connection())
    for _ in range(5):
        _call(gate, "failure")
    time.sleep(OPEN_OVER)
    _call(gate, "failure")
    assert gate.breaker_state("ik")["state"] == "open"
    assert not _admit(gate).admitted


def test_a_success_resets_the_failure_count_of_a_closed_circuit():
    gate = Gate(jobs.get_connection())
    for _ in range(4):
        _call(gate, "failure")
    _call(gate, "success")
    for _ in range(4):
        _call(gate, "failure")
    assert gate.breaker_state("ik")["state"] == "closed"


def test_half_open_admits_a_single_probe_among_concurrent_callers():
    gate = Gate(jobs.get_connection())
    for _ in range(5):
        _call(gate, "failure")
    time.sleep(OPEN_OVER)
    results = []
    barrier = threading.Barrier(20)

    def ask() -> None:
        barrier.wait()
        results.append(_admit(gate))

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.admitted for r in results) == 1
    assert {r.code for r in results if not r.admitted} == {resilience.HALF_OPEN_BUSY}


def test_the_tenant_window_admits_up_to_its_limit_then_frees_a_slot_as_the_window_slides():
    gate = Gate(jobs.get_connection())
    first = [_admit(gate, tenant_limit=5, window_ms=3000) for _ in range(3)]
    time.sleep(1.5)
    later = [_admit(gate, tenant_limit=5, window_ms=3000) for _ in range(2)]
    assert all(a.admitted for a in first + later)
    over = _admit(gate, tenant_limit=5, window_ms=3000)
    assert not over.admitted and over.code == resilience.TENANT_LIMIT
    time.sleep(1.55)  # the first three left the window; the last two stay in it for 1.45 s more
    assert [_admit(gate, tenant_limit=5, window_ms=3000).admitted for _ in range(4)] == [True] * 3 + [False]
    conn = jobs.get_connection()
    ttl = conn.pttl(resilience.tenant_window_key(1))
    assert 0 < ttl <= 3000  # the sorted set cleans itself up when the tenant goes quiet


def test_other_tenants_are_not_limited_by_a_busy_one():
    gate = Gate(jobs.get_connection())
    for _ in range(5):
        _admit(gate, tenant_limit=5)
    assert not _admit(gate, tenant_limit=5).admitted
    assert _admit(gate, tenant_limit=5, organization_id=2).admitted


def test_the_handler_rate_limit_refuses_with_the_wait_until_a_slot_frees():
    gate = Gate(jobs.get_connection())
    assert all(_admit(gate, handler_limit=2, window_ms=2000).admitted for _ in range(2))
    refused = _admit(gate, handler_limit=2, window_ms=2000)
    assert refused.code == resilience.HANDLER_LIMIT and 0 < refused.wait <= 2.0


def test_a_dead_holders_concurrency_slot_frees_when_its_lease_expires():
    gate = Gate(jobs.get_connection())
    held = _admit(gate, concurrency=1, lease_ms=2000)
    assert held.admitted
    gate._held.clear()  # the holder "dies": nobody renews or releases its lease
    assert _admit(gate, concurrency=1, lease_ms=2000).code == resilience.CONCURRENCY
    time.sleep(2.05)
    assert _admit(gate, concurrency=1, lease_ms=2000).admitted


def test_items_over_the_tenant_limit_wait_without_spending_attempts(py_handler, org, run_jobs, settings):
    settings.RUNNER_TENANT_DEFER = 2.0
    tenant = RunnerSettings.objects.create(organization=org, rate_limit_per_minute=10)
    jobs.get_connection().set("runner:test:produce", 6)
    execution = executions.execution_start(handler=py_handler, organization_id=org.pk, trigger="manual")
    tasks.execution_run(execution.pk)  # all six queued at once (under a minute of the limit)
    tenant.rate_limit_per_minute = 3  # then the limit drops below them
    tenant.save()
    run_jobs(settle=1.0)
    assert ExecutionItem.objects.filter(status="succeeded").count() == 3
    waiting = ExecutionItem.objects.filter(status="pending")
    assert waiting.count() == 3 and all(i.attempts == 0 and i.dlq_at is None for i in waiting)
    # The waiting items are in a deferred job (a group of single items: one job for the group).
    scheduled = jobs.get_connection().zrange("rq:scheduled:items-p2", 0, -1)
    deferred = [jobs.fetch_job(j.decode()) for j in scheduled]
    in_deferred = {i for job in deferred if job for i in job.kwargs["item_ids"]}
    assert {i.pk for i in waiting} <= in_deferred


def test_a_tenant_over_its_rate_limit_is_parked_instead_of_picked_between_another_tenants_items(
    py_handler, integration, org, run_jobs, settings
):
    """Tenant A floods the queue and hits its own limit while tenant B's ten jobs wait beside it: A
    is picked once, refused and parked, and B's jobs then run without A's jobs being picked (each
    of those picks, only to be put back, was a turn B lost). Counted, not timed."""
    settings.RUNNER_TENANT_DEFER = 60.0  # A stays parked for the whole run
    connection = jobs.get_connection()
    tenant = RunnerSettings.objects.create(organization=org, rate_limit_per_minute=1000)
    connection.set("runner:test:produce", 200)
    a = executions.execution_start(handler=py_handler, organization_id=org.pk, trigger="manual")
    tasks.execution_run(a.pk)  # twenty jobs of ten items queued at once (under a minute of the limit)
    tenant.rate_limit_per_minute = 10  # then A's limit allows one of them
    tenant.save()
    other = Organization.objects.create(name="Loja B", slug="runner-b")
    shared = Handler.objects.create(
        integration=integration,
        handler_key="shared",
        direction="inbound",
        callable_path="tests.runner.handlers",
    )
    connection.set("runner:test:produce", 100)
    b = executions.execution_start(handler=shared, organization_id=other.pk, trigger="manual")
    tasks.execution_run(b.pk)  # B's ten jobs
    run_jobs(settle=0)
    assert ExecutionItem.objects.filter(execution=b, status="succeeded").count() == 100
    assert ExecutionItem.objects.filter(execution=a, status="succeeded").count() == 10
    # A's jobs were refused by its limit once in all (B is under its own): not once per job.
    refused = int(connection.hget(prometheus.JOBS_KEY, "items-p2|outcome|deferred") or 0)
    assert refused == 1
    # Nothing lost nor spent: A's other 190 items wait in its list, attempts untouched.
    waiting = ExecutionItem.objects.filter(execution=a, status="pending")
    assert waiting.count() == 190 and not waiting.filter(attempts__gt=0).exists()
    assert fairshare.waiting(connection, ["items-p2"])["items-p2"] == 19


def test_items_over_the_handlers_rate_limit_wait_without_spending_attempts(
    py_handler, org, run_jobs, settings
):
    settings.RUNNER_TENANT_DEFER = 2.0
    py_handler.rate_limit_per_minute = 2
    py_handler.save()
    jobs.get_connection().set("runner:test:produce", 5)
    executions.execution_start(handler=py_handler, organization_id=org.pk, trigger="manual")
    run_jobs(settle=1.0)
    assert ExecutionItem.objects.filter(status="succeeded").count() == 2
    waiting = ExecutionItem.objects.filter(status="pending")
    assert waiting.count() == 3 and all(i.attempts == 0 and i.dlq_at is None for i in waiting)
    assert sorted(processed()) == ["e0", "e1"]


def test_a_paused_handler_keeps_its_items_waiting_and_resumes_them_in_order(
    py_handler, org, run_jobs, settings
):
    settings.RUNNER_PAUSE_DEFER = 1.0
    operator.handler_set_paused(handler=py_handler, paused=True)
    jobs.get_connection().set("runner:test:produce", 5)
    execution = executions.execution_start(handler=py_handler, organization_id=org.pk, trigger="manual")
    run_jobs(settle=0.5)
    assert processed() == []
    assert ExecutionItem.objects.filter(execution=execution, status="pending", attempts=0).count() == 5
    operator.handler_set_paused(handler=py_handler, paused=False)
    run_jobs()
    assert processed() == [f"e{i}" for i in range(5)]


def test_a_pause_does_not_touch_other_handlers(py_handler, integration, org, run_jobs, fast):
    other = Handler.objects.create(
        integration=integration,
        handler_key="other",
        direction="inbound",
        callable_path="tests.runner.handlers",
    )
    operator.handler_set_paused(handler=py_handler, paused=True)
    jobs.get_connection().set("runner:test:produce", 2)
    executions.execution_start(handler=other, organization_id=org.pk, trigger="manual")
    run_jobs(settle=0.5)
    assert sorted(processed()) == ["e0", "e1"]


def test_the_handler_config_is_cached_and_invalidated_when_saved(py_handler, org):
    _, first, _ = cache.load("crm-x", "leads", org.pk)
    assert first is not None and first["concurrency"] == 10
    Handler.objects.filter(pk=py_handler.pk).update(concurrency=3)  # no signal: the cache still answers
    assert cache.load("crm-x", "leads", org.pk)[1]["concurrency"] == 10
    py_handler.refresh_from_db()
    py_handler.concurrency = 4
    py_handler.save()
    assert cache.load("crm-x", "leads", org.pk)[1]["concurrency"] == 4
    ttl = jobs.get_connection().ttl("runner:cache:handlers:crm-x:leads")
    assert 0 < ttl <= 60
    py_handler.integration.enabled = False
    py_handler.integration.save()
    assert cache.load("crm-x", "leads", org.pk)[0]["enabled"] is False
    py_handler.delete()
    assert cache.load("crm-x", "leads", org.pk)[1] is None
