"""Shared plumbing of the runner benchmarks: set-up, real worker processes, waiting, percentiles."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.common import ensure_database
from crm import jobs
from crm.models import Organization
from runner.models import Execution, ExecutionItem, Handler, IntegrationType, RunnerSettings

ROOT = Path(__file__).resolve().parent.parent
ITEM_QUEUES = "items-p1,items-p2,items-p3,items-p5"


def check_scratch() -> None:
    """Refuse to run anywhere but the runner's scratch database and Redis DB 10 (it flushes them);
    create and migrate that database when needed."""
    db = os.environ.get("DATABASE_URL", "")
    redis = os.environ.get("REDIS_URL", "")
    scratch_redis = redis.rstrip("/").endswith("/10") or redis.endswith("?db=10")  # TCP or a socket
    if not db.rstrip("/").endswith("/crm_runner") or not scratch_redis:
        sys.exit("point DATABASE_URL at .../crm_runner and REDIS_URL at .../10 (this flushes them)")
    ensure_database()


def reset() -> None:
    jobs.get_connection().flushdb()
    Execution.objects.filter(integration__integration_key="bench").delete()


def noop_handler(key: str = "noop") -> Handler:
    it, _ = IntegrationType.objects.get_or_create(integration_key="bench", defaults={"name": "Bench"})
    handler, _ = Handler.objects.update_or_create(
        integration=it,
        handler_key=key,
        defaults={
            "direction": "inbound",
            "kind": Handler.Kind.PYTHON,
            "callable_path": "tests.runner.handlers.noop",
            "organization": None,
            "concurrency": 1000,
            "batch_size": 1,
            "rate_limit_per_minute": 0,
            "paused": False,
        },
    )
    return handler


def org(slug: str, *, rate_limit_per_minute: int | None) -> Organization:
    """An organization; rate_limit_per_minute None keeps the runner's default tenant limit (1,000)."""
    o, _ = Organization.objects.get_or_create(slug=slug, defaults={"name": slug})
    if rate_limit_per_minute is None:
        RunnerSettings.objects.filter(organization=o).delete()
    else:
        RunnerSettings.objects.update_or_create(
            organization=o, defaults={"rate_limit_per_minute": rate_limit_per_minute}
        )
    return o


def events(prefix: str, n: int) -> list[dict]:
    return [{"external_id": f"{prefix}{i}", "payload": {}} for i in range(n)]


class Workers:
    """`manage.py workers --processes N [--burst]` as a child process group, stopped on exit.

    burst=False keeps them waiting for work that is yet to come (they are stopped on exit)."""

    def __init__(self, processes: int, queues: str = ITEM_QUEUES, *, burst: bool = True) -> None:
        self.argv = [
            sys.executable,
            str(ROOT / "manage.py"),
            "workers",
            "--processes",
            str(processes),
            "--queues",
            queues,
            "--settle",
            "6",
            "--no-recover",
        ]
        if burst:
            self.argv.append("--burst")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Workers:
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def wait_workers(n: int, timeout: float = 60) -> None:
    """Until n workers have registered in Redis (they boot slower on a loaded machine)."""
    from rq import Worker

    connection = jobs.get_connection()
    wait_for(lambda: Worker.count(connection=connection) >= n, timeout=timeout, what=f"{n} workers to start")


def wait_for(check: Callable[[], bool], *, timeout: float, what: str, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def completed(execution_ids: Sequence[int]) -> bool:
    return Execution.objects.filter(pk__in=execution_ids, status=Execution.Status.COMPLETED).count() == len(
        execution_ids
    )


def items_started(execution_ids: Sequence[int]) -> int:
    return ExecutionItem.objects.filter(execution_id__in=execution_ids).exclude(started_at=None).count()


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = max(math.ceil(p / 100 * len(ordered)) - 1, 0)
    return ordered[k]
