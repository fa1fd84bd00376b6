"""Throughput of the runner's full item path (limits checked, status recorded), in one burst worker.

    DATABASE_URL=… REDIS_URL=… SECRET_KEY=… ENCRYPTION_KEY=… \\
        .venv/bin/python benchmarks/runner_items.py [N] [--http-items M] [--batch-size B]

Three figures from the same run: a no-op in-process handler (N items), a no-op RQ job baseline (N
jobs), and a batch HTTP handler (M items, batches of B) answered by the loopback sandbox
(project/sandboxes/runner.py). Target (the issue): the item path at least 0.5x the baseline.

Uses the configured database (migrated) and flushes the configured Redis database: point both at
scratch ones (crm_runner and Redis DB 10).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django

django.setup()

from benchmarks import runner_common as rc  # noqa: E402
from crm import jobs, workers  # noqa: E402
from crm.models import Organization  # noqa: E402
from project.sandboxes.runner import HandlerSandbox  # noqa: E402
from runner import events, executions  # noqa: E402
from runner.models import Execution, Handler, IntegrationType, RunnerSettings  # noqa: E402

TARGET = 0.5


def _setup() -> tuple[Organization, IntegrationType]:
    org, _ = Organization.objects.get_or_create(slug="bench-runner", defaults={"name": "Bench"})
    it, _ = IntegrationType.objects.get_or_create(integration_key="bench", defaults={"name": "Bench"})
    RunnerSettings.objects.update_or_create(organization=org, defaults={"rate_limit_per_minute": 10_000_000})
    return org, it


def noop_items(org: Organization, it: IntegrationType, n: int) -> float:
    handler, _ = Handler.objects.update_or_create(
        integration=it,
        handler_key="noop",
        defaults={
            "direction": "inbound",
            "kind": Handler.Kind.PYTHON,
            "callable_path": "tests.runner.handlers.noop",
            "organization": org,
            "concurrency": 1000,
            "batch_size": 1,
        },
    )
    jobs.get_connection().set("runner:test:produce", n)
    execution = executions.execution_start(handler=handler, organization_id=org.pk, trigger="manual")
    workers.run_burst(["runs"], settle=0)
    start = time.monotonic()
    workers.run_burst(["items-p2"], settle=0)
    took = time.monotonic() - start
    execution.refresh_from_db()
    assert execution.status == Execution.Status.COMPLETED, execution.status
    assert execution.items_succeeded == n, execution.items_succeeded
    Execution.objects.filter(pk=execution.pk).delete()
    return n / took


def noop_jobs(n: int) -> float:
    jobs.enqueue_many("tests.runner.handlers.noop_job", queue="items-p3", kwargs_list=[{} for _ in range(n)])
    start = time.monotonic()
    workers.run_burst(["items-p3"], settle=0)
    return n / (time.monotonic() - start)


def http_batch_items(org: Organization, it: IntegrationType, n: int, batch_size: int) -> tuple[float, int]:
    with HandlerSandbox() as sandbox:
        handler, _ = Handler.objects.update_or_create(
            integration=it,
            handler_key="http-batch",
            defaults={
                "direction": "outbound",
                "kind": Handler.Kind.HTTP,
                "endpoint_url": sandbox.url,
                "organization": org,
                "concurrency": 1000,
                "batch_size": batch_size,
            },
        )
        produced = [{"external_id": f"h{i}", "payload": {"i": i}} for i in range(n)]
        execution = events.events_store(
            handler=handler, organization_id=org.pk, trigger="manual", events=produced
        )
        assert execution is not None  # events without ids are never duplicates
        start = time.monotonic()
        workers.run_burst(["items-p2"], settle=0)
        took = time.monotonic() - start
        execution.refresh_from_db()
        assert execution.status == Execution.Status.COMPLETED, execution.status
        assert execution.items_succeeded == n, execution.items_succeeded
        calls = sandbox.calls["/process-batch"]
    Execution.objects.filter(pk=execution.pk).delete()
    return n / took, calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("n", nargs="?", type=int, default=3000, help="no-op items and baseline jobs")
    parser.add_argument("--http-items", type=int, default=3000, help="items for the batch HTTP handler")
    parser.add_argument("--batch-size", type=int, default=50, help="batch size of the HTTP handler")
    args = parser.parse_args()
    rc.check_scratch()  # refuses any database but crm_runner / Redis DB 10 (flushed next); creates it
    jobs.get_connection().flushdb()
    org, it = _setup()
    print(f"runner throughput: {args.n} no-op items vs {args.n} no-op RQ jobs, one in-process burst worker")
    items_s = noop_items(org, it, args.n)
    jobs_s = noop_jobs(args.n)
    ratio = items_s / jobs_s
    print(f"  runner item path (no-op in-process handler): {items_s:.0f} items/s")
    print(f"  no-op RQ job baseline:                       {jobs_s:.0f} jobs/s")
    verdict = "PASS" if ratio >= TARGET else "FAIL"
    print(f"  ratio {ratio:.2f}x (target >= {TARGET}x): {verdict}")
    http_s, calls = http_batch_items(org, it, args.http_items, args.batch_size)
    print(
        f"  batch HTTP handler (loopback sandbox, batches of {args.batch_size}): "
        f"{args.http_items} items in {calls} POST /process-batch = {http_s:.0f} items/s"
    )
    jobs.get_connection().flushdb()
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
