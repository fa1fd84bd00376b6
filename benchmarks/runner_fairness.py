"""Fairness: a tenant's huge run against another tenant's small one on the same workers.

    DATABASE_URL=postgres://…/crm_runner REDIS_URL=redis://…/10 SECRET_KEY=… ENCRYPTION_KEY=… \\
        .venv/bin/python benchmarks/runner_fairness.py [--a-items 100000] [--b-items 100] \\
        [--a-limits 60000,1000000] [--processes 2]

The issue's scenario: tenant A stores 100,000 items, tenant B 100 (both trigger `queue`, same
priority queue, same no-op in-process handler). B's completion time (from storing its items to its
execution completing) is measured with real worker processes (`manage.py workers --processes N`,
not --burst: B arrives after they start): B alone, then B stored while the workers are busy with
A's backlog, once per limit of A:

- A at the runner's default tenant limit (1,000 items/minute, no RunnerSettings): A is held far
  below what the workers can do, so there is no contention — B runs on idle workers;
- A's limit raised (`--a-limits`, RunnerSettings) so that A could take every worker: both tenants
  compete. What the runner does for fairness is printed for each: a run larger than a minute of its
  tenant's limit is fed to the queue a slice (a tenth of the limit) at a time, so B queues behind
  at most that slice; a run within a minute of its limit is queued at once, and B's jobs wait
  behind all of it (one FIFO queue per priority, no turn-taking between tenants).

Target: B with A at most 2x B alone. Prints A's items queued ahead of B when B arrived and A's
items done when B completed. Since the queues serve tenants in turn (crm.fairshare, docs/
fair-share.md), B's jobs take every other turn whatever A's backlog.

Then the cost of a pick (`--pick-tenants`): µs per `fairshare.pick` (one Lua call, the round trip
included) with 1, 100, 1,000 and 10,000 tenants waiting on one queue — flat means O(log tenants).
Flushes Redis DB 10 and deletes its executions in crm_runner.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django

django.setup()

from rq.utils import as_text  # noqa: E402

from benchmarks import runner_common as rc  # noqa: E402
from crm import fairshare, jobs, prometheus  # noqa: E402
from crm.models import Organization  # noqa: E402
from runner import events, executions  # noqa: E402
from runner.models import DEFAULT_TENANT_LIMIT, Execution, ExecutionItem, Handler  # noqa: E402

TARGET = 2.0


@dataclass
class Case:
    limit: int | None  # A's items per minute (None: the default, no RunnerSettings)
    how: str = ""  # what the runner does with A's run
    stored: float = 0.0
    ahead: int = 0  # A's items queued, not started, when B was stored
    seconds: float = 0.0  # B's completion time
    a_done: int = 0  # A's items done when B completed
    a_rate: float = 0.0  # A's items/s while B ran
    outcomes: dict[str, int] = field(default_factory=dict)  # job outcomes while B ran (B is never deferred)
    runs: list[float] = field(default_factory=list)  # B's completion times beside A (median: seconds)
    load: float = 0.0

    @property
    def label(self) -> str:
        if self.limit is None:
            return f"A at the default limit ({DEFAULT_TENANT_LIMIT:,}/min)"
        return f"A's limit raised to {self.limit:,}/min"


def b_completion(handler: Handler, tenant_b: int, n: int, *, timeout: float) -> float:
    start = time.monotonic()
    b = events.events_store(
        handler=handler, organization_id=tenant_b, trigger="queue", events=rc.events("b", n)
    )
    assert b is not None  # events without ids are never duplicates
    rc.wait_for(lambda: rc.completed([b.pk]), timeout=timeout, what="tenant B's execution", every=0.02)
    return time.monotonic() - start


def queued_ahead(backlog: Execution) -> int:
    """A's items that have an item job and have not started (all pending ones of a run not fed)."""
    fed_through = Execution.objects.values_list("fed_through", flat=True).get(pk=backlog.pk)
    pending = ExecutionItem.objects.filter(execution=backlog, status=ExecutionItem.Status.PENDING)
    return (pending if fed_through is None else pending.filter(id__lte=fed_through)).count()


def done(backlog: Execution) -> int:
    return ExecutionItem.objects.filter(execution=backlog, status=ExecutionItem.Status.SUCCEEDED).count()


def with_backlog(
    case: Case, handler: Handler, a: Organization, b: Organization, args: argparse.Namespace
) -> None:
    rc.reset()
    rc.org(a.slug, rate_limit_per_minute=case.limit)
    limit = case.limit or DEFAULT_TENANT_LIMIT
    t0 = time.monotonic()
    backlog = events.events_store(
        handler=handler, organization_id=a.pk, trigger="queue", events=rc.events("a", args.a_items)
    )
    assert backlog is not None
    case.stored = time.monotonic() - t0
    backlog.refresh_from_db()
    if backlog.fed_through is not None:
        size = max(limit // executions.PACE_SLICES, 1)
        case.how = (
            f"paced: more than a minute of its limit, fed a slice of {size:,} items every "
            f"{60 / executions.PACE_SLICES:.0f} s, at most one slice queued"
        )
    else:
        case.how = f"not paced: within a minute of its limit, all {args.a_items:,} items queued at once"
    if args.a_limit_after:
        # A's jobs are queued; now they meet its own limit (a limit lowered, or many runs each
        # within it): B runs beside a tenant whose waiting jobs its limit refuses.
        rc.org(a.slug, rate_limit_per_minute=args.a_limit_after)
        case.how += f"; then A's limit lowered to {args.a_limit_after:,}/min"
    print(f"  {case.label}: {case.how}; stored and queued in {case.stored:.1f}s", flush=True)
    with rc.Workers(args.processes, burst=False):
        rc.wait_for(lambda: rc.items_started([backlog.pk]) > 0, timeout=60, what="the workers to start")
        time.sleep(args.warm)  # the workers in full swing on A
        case.ahead = queued_ahead(backlog)
        before, t0, counted = done(backlog), time.monotonic(), outcomes()
        case.runs = [
            b_completion(handler, b.pk, args.b_items, timeout=args.timeout) for _ in range(args.b_repeat)
        ]
        case.seconds = statistics.median(case.runs)
        case.a_done = done(backlog)
        case.outcomes = {k: v - counted.get(k, 0) for k, v in outcomes().items() if v - counted.get(k, 0)}
    case.a_rate = (case.a_done - before) / (time.monotonic() - t0)
    case.load = os.getloadavg()[0]


def outcomes() -> dict[str, int]:
    """Job outcomes on the item queues so far (the workers' counts for /metrics), all queues
    together: deferred ones are picks that ran no item."""
    totals: dict[str, int] = {}
    for key, value in jobs.get_connection().hgetall(prometheus.JOBS_KEY).items():
        queue, kind, outcome = (*as_text(key).split("|", 2), "", "")[:3]
        if kind == "outcome" and queue.startswith("items-"):
            totals[outcome] = totals.get(outcome, 0) + int(value)
    return totals


def _evalsha_usec(connection) -> tuple[int, int]:
    stats = connection.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def pick_cost(tenants: int, picks: int = 5000) -> tuple[float, float]:
    """µs per pick with `tenants` tenants waiting on one queue (each keeps work for every pick):
    seen by the client (round trip included) and inside Redis (the script alone)."""
    connection = jobs.get_connection()
    connection.flushdb()
    per_tenant = picks // tenants + 2
    with connection.pipeline(transaction=False) as pipe:
        for t in range(tenants):
            for i in range(per_tenant):
                job_id = f"pick-{t}-{i}"
                fairshare.push(pipe, queue="items-p3", tenant=str(t), job_id=job_id)
                pipe.hset(f"rq:job:{job_id}", "status", "queued")
            if len(pipe) > 20_000:
                pipe.execute()
        pipe.execute()
    calls, usec = _evalsha_usec(connection)
    start = time.perf_counter()
    for _ in range(picks):
        fairshare.pick(connection, ["items-p1", "items-p2", "items-p3"])
    elapsed = time.perf_counter() - start
    calls_after, usec_after = _evalsha_usec(connection)
    connection.flushdb()
    return elapsed / picks * 1e6, (usec_after - usec) / max(calls_after - calls, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--a-items", type=int, default=100_000)
    parser.add_argument("--b-items", type=int, default=100)
    parser.add_argument(
        "--a-limits",
        default="60000,1000000",
        help="A's raised limits (items/minute), comma-separated; the default limit is measured too",
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--b-repeat", type=int, default=3, help="B's runs beside each backlog (median)")
    parser.add_argument("--warm", type=float, default=3, help="seconds the workers run on A before B comes")
    parser.add_argument("--timeout", type=float, default=1200, help="give up on B after this many seconds")
    parser.add_argument("--pick-tenants", default="1,100,1000,10000", help="tenants waiting, per pick figure")
    parser.add_argument(
        "--skip-default-limit",
        action="store_true",
        help="only the raised limits (A's store is long at 1,000,000)",
    )
    parser.add_argument("--skip-fairness", action="store_true", help="only the pick figures")
    parser.add_argument(
        "--a-limit-after",
        type=int,
        default=0,
        help="A's limit (items/minute) once its run is queued, 0: unchanged; below A's queued items, "
        "A's waiting jobs meet its own limit while B runs",
    )
    args = parser.parse_args()
    rc.check_scratch()
    pick_tenants = [int(x) for x in args.pick_tenants.split(",") if x.strip()]
    for n in pick_tenants:
        client, server = pick_cost(n)
        print(
            f"  pick with {n:>6,} tenants waiting: {server:6.1f} µs in Redis, {client:7.1f} µs seen by "
            f"the client (round trip, load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    if args.skip_fairness:
        return 0
    rc.reset()
    handler = rc.noop_handler()
    a = rc.org("bench-tenant-a", rate_limit_per_minute=None)
    b = rc.org("bench-tenant-b", rate_limit_per_minute=None)
    raised = [Case(int(x)) for x in args.a_limits.split(",") if x.strip()]
    cases = raised if args.skip_default_limit else [Case(None), *raised]
    print(
        f"fairness: tenant A {args.a_items:,} items, tenant B {args.b_items} items (default limit), "
        f"{args.processes} worker processes, load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    with rc.Workers(args.processes, burst=False):  # not --burst: B comes after they start
        rc.wait_workers(args.processes)
        time.sleep(1)  # and settle into waiting for work
        # The first run pays the workers' imports and cold caches, which the runs with A's backlog
        # do not: it is shown, and the median of the next ones is the baseline.
        first = b_completion(handler, b.pk, args.b_items, timeout=args.timeout)
        runs = [b_completion(handler, b.pk, args.b_items, timeout=args.timeout) for _ in range(3)]
    alone = statistics.median(runs)
    print(
        f"  B alone: {alone:.2f}s (median of {', '.join(f'{r:.2f}' for r in runs)}; "
        f"the first, on cold workers: {first:.2f}s)",
        flush=True,
    )
    for case in cases:
        with_backlog(case, handler, a, b, args)
        print(
            f"    B with A's backlog: {case.seconds:.2f}s ({case.seconds / alone:.1f}x alone; median of "
            f"{', '.join(f'{r:.2f}' for r in case.runs)}, load {case.load:.1f}); "
            f"A's items queued ahead of B: {case.ahead:,}; A done by then: {case.a_done:,} of "
            f"{args.a_items:,} ({case.a_rate:,.0f} items/s while B waited); jobs run meanwhile by "
            f"outcome: {', '.join(f'{k} {v:,}' for k, v in sorted(case.outcomes.items())) or 'none'}",
            flush=True,
        )
    rc.reset()
    rc.org(a.slug, rate_limit_per_minute=None)
    # B alone again, at the end's load: the backlogs' cases ran long after the first baseline.
    with rc.Workers(args.processes, burst=False):
        rc.wait_workers(args.processes)
        time.sleep(1)
        b_completion(handler, b.pk, args.b_items, timeout=args.timeout)  # cold workers
        after = [b_completion(handler, b.pk, args.b_items, timeout=args.timeout) for _ in range(3)]
    alone = statistics.median(runs + after)
    print(
        f"  B alone at the end: median of {', '.join(f'{r:.2f}' for r in after)} (load "
        f"{os.getloadavg()[0]:.1f}); baseline: the median of both, {alone:.2f}s",
        flush=True,
    )

    print(f"\n  {'case':<40} {'B s':>8} {'x alone':>8} {'A ahead':>9} {'A done':>9}  verdict")
    failed = False
    for case in cases:
        ratio = case.seconds / alone
        ok = ratio <= TARGET
        failed = failed or not ok
        print(
            f"  {case.label:<40} {case.seconds:>8.2f} {ratio:>8.1f} {case.ahead:>9,} {case.a_done:>9,}  "
            f"{'PASS' if ok else 'FAIL'} (target <= {TARGET:.0f}x)"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
