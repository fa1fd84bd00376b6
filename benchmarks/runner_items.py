"""Items/s through the full item path with a no-op in-process handler and one burst worker.

    DATABASE_URL=… REDIS_URL=… SECRET_KEY=… ENCRYPTION_KEY=… .venv/bin/python benchmarks/runner_items.py [N]

Uses the configured database (migrated) and flushes the configured Redis database: point both at
scratch ones. Prints items/s for the runner's item path and for a no-op RQ job baseline.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django

django.setup()

from crm import jobs, workers  # noqa: E402
from crm.models import Organization  # noqa: E402
from runner import services  # noqa: E402
from runner.models import Execution, Handler, IntegrationType  # noqa: E402


def main(n: int) -> None:
    conn = jobs.get_connection()
    conn.flushdb()
    org, _ = Organization.objects.get_or_create(slug="bench-runner", defaults={"name": "Bench"})
    it, _ = IntegrationType.objects.get_or_create(integration_key="bench", defaults={"name": "Bench"})
    handler, _ = Handler.objects.update_or_create(
        integration=it,
        handler_key="noop",
        defaults={
            "direction": "inbound",
            "callable_path": "tests.runner.handlers.noop",
            "organization": org,
            "concurrency": 1000,
        },
    )
    from runner.models import RunnerSettings

    RunnerSettings.objects.update_or_create(organization=org, defaults={"rate_limit_per_minute": 10_000_000})
    conn.set("runner:test:produce", n)
    execution = services.execution_start(handler=handler, organization_id=org.pk, trigger="manual")
    workers.run_burst(["runs"], settle=0)
    start = time.monotonic()
    workers.run_burst(["items-p2"], settle=0)
    took = time.monotonic() - start
    execution.refresh_from_db()
    assert execution.status == Execution.Status.COMPLETED, execution.status
    print(f"runner item path: {n} items in {took:.2f}s = {n / took:.0f} items/s")

    jobs.enqueue_many("tests.runner.handlers.noop_job", queue="items-p3", kwargs_list=[{} for _ in range(n)])
    start = time.monotonic()
    workers.run_burst(["items-p3"], settle=0)
    took = time.monotonic() - start
    print(f"no-op RQ job baseline: {n} jobs in {took:.2f}s = {n / took:.0f} jobs/s")
    Execution.objects.filter(pk=execution.pk).delete()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
