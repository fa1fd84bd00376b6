"""Jobs per second through one worker process: RQ's default forking Worker against the project's.

Usage (against the Redis in REDIS_URL, default the embedded one; use a spare database):
    REDIS_URL=redis://127.0.0.1:6379/9 .venv/bin/python benchmarks/worker_throughput.py [--jobs 2000]

Both runs use the same queue, the same no-op job and the same JSON serializer; the figures
include RQ's bookkeeping for every job (registries, results). The Redis database is flushed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django

django.setup()

from rq import Worker as ForkingWorker  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402

from crm import jobs  # noqa: E402
from crm.worker import Worker  # noqa: E402

QUEUE = "items-p5"


def measure(worker_class: type, n: int) -> float:
    connection = jobs.get_connection()
    connection.flushdb()
    jobs.enqueue_many("crm.tasks.noop", queue=QUEUE, kwargs_list=[{} for _ in range(n)])
    worker = worker_class([jobs.get_queue(QUEUE)], connection=connection, serializer=JSONSerializer)
    started = time.perf_counter()
    worker.work(burst=True, logging_level="ERROR")
    elapsed = time.perf_counter() - started
    assert connection.llen(f"rq:queue:{QUEUE}") == 0
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    args = parser.parse_args()
    import logging

    logging.getLogger("crm.jobs").setLevel(logging.WARNING)
    baseline = measure(ForkingWorker, args.jobs)
    ours = measure(Worker, args.jobs)
    print(f"no-op jobs, one process, {args.jobs} jobs")
    print(f"  rq.Worker (fork per job, baseline): {baseline:8.0f} jobs/s")
    print(f"  crm.worker.Worker (no fork):        {ours:8.0f} jobs/s   ({ours / baseline:.1f}x)")
    jobs.get_connection().flushdb()


if __name__ == "__main__":
    main()
