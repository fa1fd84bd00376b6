"""Fairness: a tenant's huge run does not starve another tenant's small one.

    DATABASE_URL=postgres://…/crm_runner REDIS_URL=redis://…/10 SECRET_KEY=… ENCRYPTION_KEY=… \\
        .venv/bin/python benchmarks/runner_fairness.py [--a-items 100000] [--b-items 100] \\
        [--processes 2]

The issue's scenario: tenant A enqueues 100,000 items, tenant B 100 (both trigger `queue`, same
priority, the runner's default tenant limit of 1,000 items/minute). B's completion time (from
storing its items to its execution completing) is measured twice with real worker processes
(`manage.py workers --processes N`, not --burst: B arrives after they start): B alone, then B
stored right after A's backlog with the workers busy on it. Target: B with A at most 2x B alone.
No-op in-process handler. Flushes Redis DB 10 and deletes its executions in crm_runner.
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
from runner import services  # noqa: E402
from runner.models import ExecutionItem, Handler  # noqa: E402

TARGET = 2.0


def b_completion(handler: Handler, tenant_b: int, n: int, *, timeout: float) -> float:
    start = time.monotonic()
    b = services.events_store(
        handler=handler, organization_id=tenant_b, trigger="queue", events=rc.events("b", n)
    )
    assert b is not None  # events without ids are never duplicates
    rc.wait_for(lambda: rc.completed([b.pk]), timeout=timeout, what="tenant B's execution", every=0.02)
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--a-items", type=int, default=100_000)
    parser.add_argument("--b-items", type=int, default=100)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=240, help="give up on B after this many seconds")
    args = parser.parse_args()
    rc.check_scratch()
    rc.reset()
    handler = rc.noop_handler()
    a = rc.org("bench-tenant-a", rate_limit_per_minute=None)
    b = rc.org("bench-tenant-b", rate_limit_per_minute=None)
    print(
        f"fairness: tenant A {args.a_items} items, tenant B {args.b_items} items, default tenant limit; "
        f"{args.processes} worker processes"
    )
    with rc.Workers(args.processes, burst=False):  # not --burst: B comes after they start
        rc.wait_workers(args.processes)
        time.sleep(1)  # and settle into waiting for work
        alone = b_completion(handler, b.pk, args.b_items, timeout=args.timeout)
    print(f"  B alone: {alone:.2f}s")
    rc.reset()
    t0 = time.monotonic()
    backlog = services.events_store(
        handler=handler, organization_id=a.pk, trigger="queue", events=rc.events("a", args.a_items)
    )
    assert backlog is not None
    print(f"  stored and queued A's items in {time.monotonic() - t0:.1f}s")
    with rc.Workers(args.processes, burst=False):
        rc.wait_for(lambda: rc.items_started([backlog.pk]) > 0, timeout=60, what="the workers to start")
        with_a = b_completion(handler, b.pk, args.b_items, timeout=args.timeout)
        done_a = ExecutionItem.objects.filter(execution=backlog, status="succeeded").count()
    print(f"  B with A's backlog: {with_a:.2f}s (A had {done_a} of {args.a_items} items done by then)")
    ratio = with_a / alone
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(f"  ratio {ratio:.2f}x (target <= {TARGET:.0f}x): {verdict}")
    rc.reset()
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
