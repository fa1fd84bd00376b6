"""Flows: event -> first send latency with real workers, and the periodic pass's cost.

    DATABASE_URL=postgres://.../crm_flows_bench REDIS_URL=redis://.../14 SECRET_KEY=... ENCRYPTION_KEY=... \\
    .venv/bin/python benchmarks/flows.py [--rate 200] [--seconds 60] [--processes 2] [--page 20] \\
        [--waiting 1000000] [--due 10000] [--customers 1000000] [--parts latency,tick,date]

Uses (and creates, migrates) the database in DATABASE_URL; flushes the Redis database.
1. latency: a `sale` flow whose first step sends a WhatsApp template (sandbox, no latency); this
   process writes --rate sales/s for --seconds the way the ERP sync does (a page of --page sales
   every page/rate seconds, `erp.services.sales_page_store`: the sales, the "sales written" hook,
   the trigger), --processes worker processes serve `flows,whatsapp-send`. Prints the rate
   offered (and the producer's CPU), p50/p95/p99 of (message sent_at - enrollment entered_at),
   the load, and per event: statements and CPU of the producer, the workers and PostgreSQL.
2. tick: --due due enrollments among --waiting waiting ones (written with INSERT ... SELECT
   generate_series), then the tick's two reads: the due steps' batch jobs (time, queries) and
   requeue_missing over them (time); at both sizes (--due alone, then with --waiting).
3. date: --customers customers, birth dates spread over the year; a date flow's daily pass
   (time, queries, entered) and a second run the same day.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from benchmarks.common import CpuAccount, ensure_database  # noqa: E402
from campaigns.models import Campaign, Kind, WhatsappMessage  # noqa: E402
from crm import bulk, jobs, prometheus, recovery  # noqa: E402
from crm.models import Customer, Organization, Store  # noqa: E402
from erp.services import sales_page_store  # noqa: E402
from flows import services, triggers  # noqa: E402
from flows.models import DailyPass, Enrollment, Flow  # noqa: E402
from integrations import outbound  # noqa: E402
from integrations.millennium.client import ErpSale  # noqa: E402
from integrations.models import WhatsappNumber  # noqa: E402
from project.sandboxes.whatsapp import SandboxServer  # noqa: E402

PHONE_NUMBER_ID = "188888888888888"
TOKEN = "bench-flows-token"  # noqa: S105 - the sandbox's


def world(slug: str, n: int, *, birthdays: bool = False) -> Organization:
    org, _ = Organization.objects.get_or_create(slug=slug, defaults={"name": slug})
    Store.objects.get_or_create(organization=org, erp_code="B1", defaults={"name": "Bench"})
    have = Customer.objects.filter(organization=org).count()
    if have < n:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {Customer._meta.db_table} (organization_id, erp_id, name, email, phone, "  # noqa: S608
                "cpf_cnpj, "
                "marketing_consent, marketing_consent_source, whatsapp_opt_out_source, email_opt_out_source, "
                "birth_date, created_at, updated_at) SELECT %s, 'F' || i, 'Cliente' || i || ' Bench', '', "
                "'+55119' || lpad((20000000 + i)::text, 8, '0'), '', true, 'import', '', '', "
                "CASE WHEN %s THEN date '1980-01-01' + (i %% 365) ELSE NULL END, now(), now() "
                "FROM generate_series(%s, %s - 1) AS i",
                [org.pk, birthdays, have, n],
            )
        bulk.analyze_if_grown(Customer, n - have)
    return org


def flow_of(org: Organization, data: dict) -> Flow:
    Campaign.objects.filter(organization=org, kind=Kind.FLOW).delete()  # an earlier run's messages
    Flow.objects.filter(organization=org, key=data["key"]).delete()
    return services.flow_import(data=data, organization_slug=org.slug)[0]


def _sales_pages(org: Organization, n: int, page: int) -> list[list[ErpSale]]:
    """`n` new sales (one per customer, each an ERP id of its own this run) in pages of `page`."""
    run = f"{time.time():.0f}"
    store = Store.objects.get(organization=org, erp_code="B1")
    erp_ids = list(
        Customer.objects.filter(organization=org).order_by("pk").values_list("erp_id", flat=True)[:n]
    )
    now = timezone.now()
    sales = [
        ErpSale(f"S{run}-{i}", i + 1, erp_id or "", store.erp_code, now, Decimal("150.00"), ())
        for i, erp_id in enumerate(erp_ids)
    ]
    return [sales[i : i + page] for i in range(0, len(sales), page)]


def _produce(org: Organization, pages: list[list[ErpSale]], rate: float) -> dict[str, float]:
    """Write the pages as the ERP sync does (`erp.services.sales_page_store`: sales, the "sales
    written" hook, the flows' `sale` trigger, the jobs after the commit), one every len(page)/rate
    seconds. Returns the seconds taken, this thread's CPU seconds and its statements."""
    store = Store.objects.get(organization=org, erp_code="B1")
    statements = [0]

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements[0] += 1
        return execute(sql, params, many, context)

    started, cpu, at, late = time.monotonic(), time.thread_time(), 0.0, 0.0
    with connection.execute_wrapper(count):
        for records in pages:
            pause = started + at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            late = max(late, -pause)
            sales_page_store(store=store, sales=records)
            at += len(records) / rate
    elapsed = max(time.monotonic() - started, at)  # the last page's slot counts whole
    return {"seconds": elapsed, "cpu": time.thread_time() - cpu, "statements": statements[0], "late": late}


def _workers_counts() -> tuple[int, int]:
    """(statements, jobs) the workers counted in Redis (CRM_COUNT_QUERIES, crm.prometheus)."""
    redis = jobs.get_connection()
    outcomes = redis.hgetall(prometheus.JOBS_KEY)
    ran = sum(int(v) for k, v in outcomes.items() if b"|outcome|" in k)
    return int(redis.get("crm:stats:db_queries") or 0), ran


def part_latency(args: argparse.Namespace, sandbox: SandboxServer) -> None:
    n = args.rate * args.seconds
    org = world(f"flows-latency-{n}", n)
    Organization.objects.filter(pk=org.pk).update(block_multiple_campaigns=False, message_limit_count=1000)
    number = WhatsappNumber.objects.filter(phone_number_id=PHONE_NUMBER_ID).first() or WhatsappNumber(
        phone_number_id=PHONE_NUMBER_ID
    )
    number.organization, number.display_phone_number = org, "+5511930000001"
    number.graph_url, number.messages_per_second = sandbox.url, 0
    number.set_access_token(TOKEN)
    number.save()
    flow = flow_of(
        org,
        {
            "key": "bench-latency",
            "name": "bench",
            "trigger": {"type": "sale"},
            "reentry": "always",
            "steps": [{"type": "send_whatsapp", "template": "bench", "variables": ["first_name"]}],
        },
    )
    pages = _sales_pages(org, n, args.page)
    jobs.get_connection().flushdb()
    env = {**os.environ, "LOG_LEVEL": "WARNING", "CRM_COUNT_QUERIES": "1"}
    pool = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "workers",
            "--processes",
            str(args.processes),
            "--queues",
            "flows,whatsapp-send",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    cpu = CpuAccount(trees={"workers": pool.pid}, database=str(connection.settings_dict["NAME"]))
    try:
        time.sleep(5)  # workers up
        load = os.getloadavg()
        cpu.start()
        made = _produce(org, pages, args.rate)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if (
                WhatsappMessage.objects.filter(campaign__flow_step__flow=flow, sent_at__isnull=False).count()
                >= n
            ):
                break
            time.sleep(1)
        spent = cpu.stop()
        statements, ran = _workers_counts()
    finally:
        os.killpg(pool.pid, 15)
        pool.wait(timeout=60)
    entered = dict(Enrollment.objects.filter(flow=flow).values_list("customer_id", "entered_at"))
    sent = WhatsappMessage.objects.filter(campaign__flow_step__flow=flow, sent_at__isnull=False)
    lat = sorted(
        (at - entered[c]).total_seconds()
        for c, at in sent.values_list("customer_id", "sent_at")
        if at is not None and c in entered
    )
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else lat * 99
    print(
        f"latency: {n} sales asked at {args.rate}/s for {args.seconds} s in ERP pages of {args.page}, "
        f"offered {n / made['seconds']:.0f}/s (the producer's worst page {made['late']:.2f} s late), "
        f"{args.processes} worker processes: {len(entered)} entered, {len(lat)} sent; "
        f"event -> first send p50 {q[49]:.2f} s, p95 {q[94]:.2f} s, p99 {q[98]:.2f} s, "
        f"max {lat[-1] if lat else 0:.2f} s; load average {load[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    each = max(n, 1) / 1000
    print(
        f"  per event: producer {made['statements'] / max(n, 1):.2f} statements, "
        f"{made['cpu'] / each:.2f} ms CPU ({made['cpu'] / made['seconds']:.2f} of a core); "
        f"workers {statements / max(n, 1):.2f} statements, {ran / max(n, 1):.3f} jobs, "
        f"{spent['workers'] / each:.2f} ms CPU; PostgreSQL {spent['postgres'] / each:.2f} ms CPU "
        f"(other processes: {spent['other'] / spent['wall']:.1f} cores)"
    )


def _enrollments(flow: Flow, customers: list[int], total: int, due: int) -> None:
    """`total` active enrollments of `flow` (rounds over the customers), the first `due` of them due."""
    Enrollment.objects.filter(flow=flow).delete()
    c = len(customers)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Enrollment._meta.db_table} (flow_id, organization_id, customer_id, round, "  # noqa: S608
            "entry_key, status, step_index, due_at, branch, holdout, entered_at, exit_reason) "
            "SELECT %s, %s, (%s::bigint[])[1 + i %% %s], 1 + i / %s, 'k' || i, 'active', 0, "
            "CASE WHEN i < %s THEN now() - interval '1 minute' ELSE now() + interval '5 days' END, "
            "'', false, now(), '' "
            "FROM generate_series(0, %s - 1) AS i",
            [flow.pk, flow.organization_id, customers, c, c, due, total],
        )
        cursor.execute(f"ANALYZE {Enrollment._meta.db_table}")


def _tick(label: str) -> None:
    jobs.get_connection().flushdb()
    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        specs = list(triggers.due_specs())
        read = time.perf_counter() - started
    started = time.perf_counter()
    enqueued = recovery.requeue_missing(iter(specs))
    requeue = time.perf_counter() - started
    due = sum(len(s.kwargs["enrollment_ids"]) for s in specs)
    print(
        f"tick, {label}: {due} due read as {len(specs)} batch jobs in {read * 1000:.0f} ms "
        f"({len(queries)} queries); {enqueued} jobs enqueued in {requeue * 1000:.0f} ms"
    )


def part_tick(args: argparse.Namespace) -> None:
    org = world("flows-tick", 10_000)
    flow = flow_of(
        org,
        {
            "key": "bench-tick",
            "name": "bench",
            "trigger": {"type": "sale"},
            "steps": [{"type": "wait", "days": 1}],
        },
    )
    Flow.objects.filter(pk=flow.pk).update(paused=False)
    customers = list(Customer.objects.filter(organization=org).values_list("pk", flat=True))
    for total in (args.due, args.waiting):
        started = time.perf_counter()
        _enrollments(flow, customers, total, args.due)
        print(f"  ({total} enrollments written in {time.perf_counter() - started:.1f} s)")
        _tick(f"{total:,} active enrollments, {args.due:,} due")
    Enrollment.objects.filter(flow=flow).delete()


def part_date(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    org = world(f"flows-date-{args.customers}", args.customers, birthdays=True)
    print(f"  ({args.customers} customers ready in {time.perf_counter() - started:.1f} s)")
    flow = flow_of(
        org,
        {
            "key": "bench-birthday",
            "name": "bench",
            "trigger": {"type": "date", "at": "00:00"},
            "reentry": "always",
            "steps": [{"type": "wait", "days": 1}],
        },
    )
    jobs.get_connection().flushdb()
    for run in ("first", "second"):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            entered = triggers.daily_pass(flow=flow)
            elapsed = time.perf_counter() - started
        print(
            f"date pass over {args.customers:,} customers, {run} run today: {elapsed * 1000:.0f} ms, "
            f"{len(queries)} queries, {entered or 0} entered"
        )
    DailyPass.objects.filter(flow=flow).delete()
    Enrollment.objects.filter(flow=flow).delete()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--page", type=int, default=20, help="sales per ERP page (latency)")
    parser.add_argument("--waiting", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--customers", type=int, default=1_000_000)
    parser.add_argument("--parts", default="latency,tick,date")
    args = parser.parse_args()
    ensure_database()
    print(f"scale: {vars(args)}; load average {os.getloadavg()}")
    parts = args.parts.split(",")
    if "latency" in parts:
        with SandboxServer(host="127.0.0.1", port=0, numbers={PHONE_NUMBER_ID: TOKEN}) as sandbox:
            outbound.trust_origin(sandbox.url)
            part_latency(args, sandbox)
    if "tick" in parts:
        part_tick(args)
    if "date" in parts:
        part_date(args)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
