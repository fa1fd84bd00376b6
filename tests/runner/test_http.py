from __future__ import annotations

from crm import jobs
from runner import events, items
from runner.models import Execution, ExecutionItem


def _events(handler, org, n: int) -> Execution:
    execution = events.events_store(
        handler=handler,
        organization_id=org.pk,
        trigger="webhook",
        events=[{"external_id": f"x{i}", "payload": {"i": i}} for i in range(n)],
    )
    assert execution is not None
    return execution


def test_a_batch_handler_gets_process_batch_and_its_per_item_errors_are_kept_apart(
    http_handler, org, sandbox, run_jobs, fast
):
    http_handler.batch_size = 5
    http_handler.save()
    sandbox.reject_item("x3", "invalid document")
    sandbox.fail_item("x7", times=1)
    execution = _events(http_handler, org, 10)
    run_jobs()
    assert sandbox.calls["/process-batch"] == 3  # two batches, then x7's retry alone
    assert sandbox.calls["/process"] == 0
    items = {i.external_id: i for i in ExecutionItem.objects.filter(execution=execution)}
    assert (items["x3"].status, items["x3"].attempts, items["x3"].last_error) == (
        "failed",
        1,
        "invalid document",
    )
    assert items["x3"].dlq_at is not None
    assert (items["x7"].status, items["x7"].attempts) == ("succeeded", 2)
    assert items["x0"].result == {"echo": "x0"}
    execution.refresh_from_db()
    assert (execution.status, execution.items_succeeded, execution.items_failed) == ("completed", 9, 1)


def test_single_items_use_process_and_send_the_auth_header(http_handler, org, sandbox, run_jobs):
    sandbox.token = "Bearer handler-secret"
    http_handler.auth_header = "Authorization"
    http_handler.set_auth_value("Bearer handler-secret")
    http_handler.save()
    _events(http_handler, org, 3)
    run_jobs()
    assert sandbox.calls["/process"] == 3
    assert sorted(sandbox.processed) == ["x0", "x1", "x2"]


def test_an_outage_opens_the_circuit_and_items_wait_without_spending_attempts(
    http_handler, org, sandbox, run_jobs, settings
):
    settings.RUNNER_BREAKER_OPEN_SECONDS = 5  # long enough for a loaded machine to look before it half-opens
    settings.RUNNER_RETRY_BACKOFF = 0.1
    sandbox.fail_next(5, status=503)
    execution = _events(http_handler, org, 8)
    run_jobs(settle=0.5)
    state = items.gate().breaker_state("crm-x")
    assert state["state"] == "open"
    assert sandbox.calls["/process"] == 5  # nothing called once open
    assert not ExecutionItem.objects.filter(execution=execution, dlq_at__isnull=False).exists()
    run_jobs(settle=6)  # the circuit half-opens, the probes succeed, everything drains
    execution.refresh_from_db()
    assert (execution.status, execution.items_succeeded) == ("completed", 8)
    assert items.gate().breaker_state("crm-x")["state"] == "closed"
    assert max(ExecutionItem.objects.values_list("attempts", flat=True)) <= 2


def test_a_4xx_is_permanent_and_goes_to_the_dlq(http_handler, org, sandbox, run_jobs):
    sandbox.reject_item("x0", "unknown customer")
    _events(http_handler, org, 1)
    run_jobs()
    item = ExecutionItem.objects.get()
    assert item.status == "failed" and item.attempts == 1 and "unknown customer" in item.last_error
    assert items.gate().breaker_state("crm-x")["state"] == "closed"


def test_two_worker_processes_never_exceed_the_handlers_concurrency(
    http_handler, org, sandbox, worker_process
):
    from tests.conftest import wait_for

    http_handler.concurrency = 2
    http_handler.save()
    sandbox.set_latency(0.3)
    execution = _events(http_handler, org, 12)
    workers = [worker_process("--burst", "--queues", "items-p1", "--settle", "3") for _ in range(2)]
    wait_for(
        lambda: Execution.objects.get(pk=execution.pk).status == "completed",
        timeout=60,
        what="the execution to complete",
    )
    assert sandbox.max_concurrency == 2
    assert sorted(sandbox.processed) == sorted(f"x{i}" for i in range(12))
    for w in workers:
        w.wait(timeout=30)
    assert jobs.get_connection().zcard(f"runner:sem:{http_handler.pk}") == 0
