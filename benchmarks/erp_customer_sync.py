"""The ERP full customer sync from the Millennium sandbox: rows/s and peak memory, against a raw
COPY baseline in the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/crm_bench REDIS_URL=redis://127.0.0.1:6379/13 \\
    SECRET_KEY=... ENCRYPTION_KEY=... .venv/bin/python benchmarks/erp_customer_sync.py \\
        [--sizes 100000,1000000] [--page-size 1000] [--keep]

Uses (and creates and migrates if missing) the database in DATABASE_URL. For each size N it starts
the sandbox in its own process (`manage.py erp_sandbox --port 0 --customers N`, so its CPU and
memory are not the sync's) and runs, each in a fresh child process whose peak RSS is taken from
wait4():

- the sync: `erp.services.customers_sync(full=True)` into organization `bench-erp-<N>` (its
  customers deleted first: a real full load), exactly as `manage.py erp_sync customers --full`;
- the baseline: the same pages from the same sandbox through the same client (HTTP, JSON and the
  record parsing the contract requires: CPF check digits, E.164, e-mail), streamed with COPY
  into a temporary table, then one `INSERT … SELECT … ON CONFLICT (organization_id, erp_id)
  DO UPDATE … WHERE …` into `bench-erp-raw-<N>`, in one transaction.

Both organizations must then hold the same rows (counted, compared column by column in SQL, and a
few printed). Each child times its phases (HTTP, JSON, record parsing; for the sync the path
`customers_upsert` takes on PostgreSQL: de-duplication and column lists, the column arrays of
`_upsert_columns`, its `INSERT … SELECT unnest … ON CONFLICT … RETURNING`; each other kind of SQL
statement, commits), counts the calls of the functions it times, and reports the CPU it used, its
PostgreSQL backend's and the sandbox's. Rows/s is over the child's own work time (the
interpreter's start is left out).
Targets: the sync at least 0.5x the baseline's rows/s, its peak under 250 MB, and flat (largest
size within +15% of the smallest). The bench organizations' customers are deleted at the end and
the table vacuumed (`--keep` keeps them): a re-run has to empty them anyway, and 2.2M rows (or
their dead tuples, where autovacuum is off) would only weigh on the other benchmarks sharing
crm_bench.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
from django.db import IntegrityError, transaction  # noqa: E402
from django.db import connection as db  # noqa: E402
from django.utils import timezone  # noqa: E402

from benchmarks.common import ensure_database  # noqa: E402
from crm.models import Customer, Organization  # noqa: E402
from erp import services, upserts  # noqa: E402
from erp.models import ErpConnection, ErpSyncIssue  # noqa: E402
from integrations.millennium import client as millennium  # noqa: E402
from project.demo.erp import erp_connection_demo  # noqa: E402
from project.sandboxes.millennium_data import FIRST_CUSTOMER_ID  # noqa: E402

TARGET_RATIO = 0.5
TARGET_PEAK_MB = 250.0
FLAT_TOLERANCE = 0.15
RESULT = "RESULT "
COPIED = ("erp_id", "name", "email", "phone", "cpf_cnpj", "erp_trans_id", "erp_registered_at")
COMPARED = (*COPIED[1:], "marketing_consent", "whatsapp_opt_out_source", "email_opt_out_source")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- the parent ----------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@contextmanager
def sandbox(customers: int) -> Iterator[tuple[str, int]]:
    """The Millennium sandbox in its own process; yields (its URL, its pid)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "erp_sandbox",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--customers",
            str(customers),
        ],
        cwd=ROOT,
        env={**os.environ, "LOG_LEVEL": "WARNING"},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            raise RuntimeError(f"the ERP sandbox did not start: {line!r}")
        yield match.group(1), proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def delete_customers(org: Organization) -> int:
    """All of the organization's customers, in one statement (nothing refers to a bench
    organization's customers; if something does, Django's delete clears the references)."""
    try:
        with transaction.atomic(), db.cursor() as cursor:
            cursor.execute("DELETE FROM crm_customer WHERE organization_id = %s", [org.pk])
            return cursor.rowcount
    except IntegrityError:
        return Customer.objects.filter(organization=org).delete()[0]


def vacuum() -> None:
    """Reclaim the deleted customers (this server may run without autovacuum): otherwise the next
    load walks their dead index entries, and other benchmarks scan them."""
    started = time.monotonic()
    with db.cursor() as cursor:
        cursor.execute("VACUUM crm_customer")
    print(f"    VACUUM crm_customer in {time.monotonic() - started:.1f}s", flush=True)


def prepare(slug: str, url: str, page_size: int) -> Organization:
    """A fresh organization (no customers, no sync state) whose ERP is the sandbox at `url`."""
    org, _ = Organization.objects.get_or_create(slug=slug, defaults={"name": f"ERP bench {slug}"})
    started = time.monotonic()
    deleted = delete_customers(org)
    if deleted:
        print(f"    {slug}: deleted {deleted:,} earlier customers in {time.monotonic() - started:.1f}s")
    ErpSyncIssue.objects.filter(organization=org).delete()
    connection = erp_connection_demo(organization=org, base_url=url)
    ErpConnection.objects.filter(pk=connection.pk).update(
        page_size=page_size,
        timeout_seconds=60,
        customers_trans_id=0,
        customers_full_cursor=None,
        customers_full_day=None,
        customers_full_synced_at=None,
        customers_synced_at=None,
        last_error="",
        last_error_at=None,
    )
    return org


def run_child(mode: str, slug: str, *, sandbox_pid: int, every: float) -> dict[str, Any]:
    """Run this script as `--child mode` for the organization; relays its progress lines and returns
    its result, with its wall time, peak RSS (wait4) and the sandbox's CPU meanwhile."""
    sandbox_cpu = _cpu_seconds(sandbox_pid)
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            mode,
            "--org",
            slug,
            "--every",
            str(every),
        ],
        cwd=ROOT,
        env={**os.environ, "LOG_LEVEL": "WARNING"},
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert proc.stdout is not None
    result: dict[str, Any] = {}
    for line in proc.stdout:
        if line.startswith(RESULT):
            result = json.loads(line[len(RESULT) :])
        else:
            print(line.rstrip(), flush=True)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 or not result:
        raise RuntimeError(f"the {mode} child failed (exit status {proc.returncode})")
    result["wall"] = time.monotonic() - started
    result["peak_mb"] = usage.ru_maxrss / 1024
    result["child_cpu"] = usage.ru_utime + usage.ru_stime
    result["sandbox_cpu"] = _cpu_seconds(sandbox_pid) - sandbox_cpu
    result["rate"] = result["rows"] / result["seconds"] if result["seconds"] else 0.0
    return result


def compare(sync_org: Organization, raw_org: Organization, n: int) -> tuple[int, int, int, int, list[str]]:
    """(rows of the sync, rows of the baseline, sync rows missing from the baseline, rows that
    differ in any compared column) and a few spot-checked rows, printed."""
    columns = ", ".join(COMPARED)
    with db.cursor() as cursor:
        cursor.execute(
            f"""SELECT
                  (SELECT count(*) FROM crm_customer WHERE organization_id = %(sync)s),
                  (SELECT count(*) FROM crm_customer WHERE organization_id = %(raw)s),
                  count(*) FILTER (WHERE r.id IS NULL),
                  count(*) FILTER (WHERE r.id IS NOT NULL AND
                    ({", ".join(f"s.{c}" for c in COMPARED)}) IS DISTINCT FROM
                    ({", ".join(f"r.{c}" for c in COMPARED)}))
                FROM crm_customer s
                LEFT JOIN crm_customer r ON r.organization_id = %(raw)s AND r.erp_id = s.erp_id
                WHERE s.organization_id = %(sync)s""",  # noqa: S608 - constant column names
            {"sync": sync_org.pk, "raw": raw_org.pk},
        )
        sync_rows, raw_rows, missing, differ = cursor.fetchone()
        picks = sorted({0, n - 1, *random.Random(n).sample(range(n), min(n, 6))})
        erp_ids = [str(FIRST_CUSTOMER_ID + i) for i in picks]
        lines = []
        for erp_id in erp_ids:
            cursor.execute(
                f"SELECT organization_id, {columns} FROM crm_customer "  # noqa: S608
                "WHERE organization_id IN (%s, %s) AND erp_id = %s",
                [sync_org.pk, raw_org.pk, erp_id],
            )
            found = {row[0]: row[1:] for row in cursor.fetchall()}
            same = found.get(sync_org.pk) is not None and found.get(sync_org.pk) == found.get(raw_org.pk)
            shown = found.get(sync_org.pk) or ()
            lines.append(
                f"{erp_id}: {'equal' if same else 'DIFFERENT'} "
                f"(name={shown[0] if shown else None!r}, email={shown[1] if shown else None!r}, "
                f"phone={shown[2] if shown else None!r}, cpf_cnpj={shown[3] if shown else None!r})"
            )
    return sync_rows, raw_rows, missing, differ, lines


def phase_line(result: dict[str, Any]) -> str:
    total = result["seconds"] or 1.0
    parts = [f"{name} {s:.1f}s ({100 * s / total:.0f}%)" for name, s in result["phases"].items()]
    return ", ".join(parts)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def parent(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    ensure_database()
    print(
        f"ERP full customer sync vs raw COPY baseline: sizes {', '.join(f'{n:,}' for n in sizes)}, "
        f"page size {args.page_size}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    orgs: list[Organization] = []
    for n in sizes:
        print(f"\n== {n:,} customers", flush=True)
        with sandbox(n) as (url, sandbox_pid):
            print(f"  sandbox pid {sandbox_pid} at {url}", flush=True)
            sync_org = prepare(f"bench-erp-{n}", url, args.page_size)
            raw_org = prepare(f"bench-erp-raw-{n}", url, args.page_size)
            orgs += [sync_org, raw_org]
            vacuum()
            with db.cursor() as cursor:
                cursor.execute("CHECKPOINT")  # neither run pays for the other's dirty pages
            db.close()
            print(f"  sync -> {sync_org.slug} (load {os.getloadavg()[0]:.2f})", flush=True)
            sync = run_child("sync", sync_org.slug, sandbox_pid=sandbox_pid, every=args.every)
            print(f"  {sync['summary']}")
            with db.cursor() as cursor:
                cursor.execute("CHECKPOINT")
            db.close()
            print(f"  baseline -> {raw_org.slug} (load {os.getloadavg()[0]:.2f})", flush=True)
            raw = run_child("raw", raw_org.slug, sandbox_pid=sandbox_pid, every=args.every)
        for label, r in (("sync", sync), ("baseline", raw)):
            print(
                f"  {label:<8}: {r['rows']:,} rows in {r['seconds']:.1f}s = {r['rate']:,.0f} rows/s "
                f"(wall with interpreter start {r['wall']:.1f}s), peak RSS {r['peak_mb']:.0f} MB; "
                f"CPU: client {r['child_cpu']:.1f}s, its PostgreSQL backend {r['backend_cpu']:.1f}s, "
                f"sandbox {r['sandbox_cpu']:.1f}s"
            )
            print(f"    phases: {phase_line(r)}")
            if "calls" in r:
                print("    calls: " + ", ".join(f"{name} {n:,}" for name, n in r["calls"].items()))
        sync_rows, raw_rows, missing, differ, spot = compare(sync_org, raw_org, n)
        same = sync_rows == raw_rows == n and missing == 0 and differ == 0
        print(
            f"  check: sync {sync_rows:,} rows, baseline {raw_rows:,} rows, {missing:,} missing from "
            f"the baseline, {differ:,} differing in {', '.join(COMPARED)} "
            f"-> {'same rows' if same else 'MISMATCH'}"
        )
        for line in spot:
            print(f"    {line}")
        rows.append({"n": n, "sync": sync, "raw": raw, "same": same})

    smallest = min(rows, key=lambda r: r["n"])
    largest = max(rows, key=lambda r: r["n"])
    growth = largest["sync"]["peak_mb"] / smallest["sync"]["peak_mb"] - 1
    flat = growth <= FLAT_TOLERANCE
    print("\n== summary")
    header = (
        f"{'size':>10} {'sync rows/s':>12} {'sync peak MB':>13} {'baseline rows/s':>16} "
        f"{'baseline peak MB':>17} {'ratio':>6} {'peak vs smallest':>17}  verdict"
    )
    print(header)
    print("-" * len(header))
    all_ok = flat
    for r in rows:
        ratio = r["sync"]["rate"] / r["raw"]["rate"] if r["raw"]["rate"] else 0.0
        rate_ok, mem_ok = ratio >= TARGET_RATIO, r["sync"]["peak_mb"] < TARGET_PEAK_MB
        all_ok = all_ok and rate_ok and mem_ok and r["same"]
        vs = r["sync"]["peak_mb"] / smallest["sync"]["peak_mb"] - 1
        notes = [f"rate {verdict(rate_ok)}", f"memory {verdict(mem_ok)}"]
        if not r["same"]:
            notes.append("ROWS DIFFER")
        print(
            f"{r['n']:>10,} {r['sync']['rate']:>12,.0f} {r['sync']['peak_mb']:>13.0f} "
            f"{r['raw']['rate']:>16,.0f} {r['raw']['peak_mb']:>17.0f} {ratio:>6.2f} "
            f"{vs:>+16.0%}  {', '.join(notes)}"
        )
    print(
        f"targets: sync >= {TARGET_RATIO}x baseline rows/s; sync peak < {TARGET_PEAK_MB:.0f} MB; "
        f"flat: peak at {largest['n']:,} within +{FLAT_TOLERANCE:.0%} of {smallest['n']:,} "
        f"({growth:+.1%}) -> {verdict(flat)}"
    )
    print(f"overall: {verdict(all_ok)}")
    if not args.keep:
        started = time.monotonic()
        deleted = sum(delete_customers(org) for org in orgs)
        seconds = time.monotonic() - started
        print(f"cleaned up: {deleted:,} bench customers deleted in {seconds:.0f}s (--keep keeps them)")
        vacuum()


# --- the children --------------------------------------------------------------------------------


class Phases:
    """Seconds spent per phase, by wrapping the functions the sync calls (a few microseconds per
    call: a few thousand calls per million rows), and how many times each was called (a phase
    whose function the sync no longer calls shows as 0 calls, not as a silent 0 s). SQL statements
    run inside a function wrapped with `scope` are counted under that scope's name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.scope = ""

    def wrap(self, owner: Any, attribute: str, name: str, *, scope: bool = False) -> None:
        original: Callable[..., Any] = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            outer = self.scope
            if scope:
                self.scope = name
            try:
                return original(*args, **kwargs)
            finally:
                self.scope = outer
                self.seconds[name] += time.perf_counter() - started
                self.calls[name] += 1

        setattr(owner, attribute, timed)

    def sql(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        verb = sql.lstrip().split(None, 1)[0].upper()
        name = f"{self.scope}: sql {verb}" if self.scope else f"sql {verb}"
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds[name] += time.perf_counter() - started
            self.calls[name] += 1

    def instrument_client(self) -> None:
        self.wrap(httpx.Client, "get", "http")  # the request and reading the whole body
        self.wrap(httpx.Response, "json", "json")
        self.wrap(millennium, "read_page", "parse records")  # parse_customer over the page
        self.wrap(db, "_commit", "commit")


def backend_cpu() -> float:
    with db.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return _cpu_seconds(pid)  # same machine: the backend's own counters


def ticker(label: str, state: dict[str, Any], every: float) -> None:
    """A progress line every `every` seconds, from a daemon thread (it runs while the main thread
    waits on the network or PostgreSQL)."""
    started = time.monotonic()

    def loop() -> None:
        while True:
            time.sleep(every)
            elapsed = time.monotonic() - started
            status = Path("/proc/self/status").read_text().splitlines()
            kb = {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith("VmRSS:")}
            hwm = {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith("VmHWM:")}
            print(
                f"    {label}: {elapsed:5.0f}s {state['phase']:<16} {state['rows']:>10,} rows "
                f"({state['rows'] / elapsed:,.0f}/s), RSS {kb['VmRSS'] / 1024:.0f} MB "
                f"(peak {hwm['VmHWM'] / 1024:.0f} MB)",
                flush=True,
            )

    threading.Thread(target=loop, daemon=True).start()


def emit(result: dict[str, Any]) -> None:
    print(RESULT + json.dumps(result), flush=True)


def child_sync(slug: str, every: float) -> None:
    """The real full sync, as `manage.py erp_sync customers --org slug --full` runs it."""
    connection = ErpConnection.objects.select_related("organization").get(organization__slug=slug)
    phases = Phases()
    phases.instrument_client()
    phases.wrap(services, "customers_upsert", "customers_upsert", scope=True)
    # The PostgreSQL path: records -> column arrays -> one INSERT … SELECT unnest … RETURNING per
    # page (pages up to PG_UPSERT_CHUNK rows). Larger pages take model instances through _upsert.
    phases.wrap(services, "_upsert_columns", "_upsert_columns")
    phases.wrap(services, "_upsert", "_upsert")
    state: dict[str, Any] = {"phase": "syncing", "rows": 0}
    backend_start = backend_cpu()
    ticker("sync", state, every)

    def progress(result: services.SyncResult) -> None:
        state["rows"] = result.read

    started = time.perf_counter()
    with db.execute_wrapper(phases.sql):
        result = services.customers_sync(connection=connection, full=True, progress=progress)
    seconds = time.perf_counter() - started
    p, calls = phases.seconds, dict(phases.calls)
    upsert_all = p.pop("customers_upsert", 0.0)
    columns, instances = p.pop("_upsert_columns", 0.0), p.pop("_upsert", 0.0)
    inside = {k: p.pop(k) for k in list(p) if k.startswith("customers_upsert: ")}
    insert = inside.pop("customers_upsert: sql INSERT", 0.0)
    select = inside.pop("customers_upsert: sql SELECT", 0.0)
    shown = {
        "http": p.pop("http", 0.0),
        "json": p.pop("json", 0.0),
        "parse records": p.pop("parse records", 0.0),
        # _latest (a page's newest copy per ERP id) and the column lists from the records
        "dedupe + column lists": upsert_all - columns - instances - select - sum(inside.values()),
        "SELECT existing": select,  # only on the model-instance path
        "build arrays": columns + instances - insert,  # defaults of the other columns, params
        "INSERT unnest … ON CONFLICT": insert,
        **{k.replace("customers_upsert: ", "upsert "): v for k, v in inside.items()},
        "UPDATE cursor": p.pop("sql UPDATE", 0.0),
        "commit": p.pop("commit", 0.0),
    }
    shown["other"] = seconds - sum(shown.values()) - sum(p.values())
    shown.update(p)
    emit(
        {
            "rows": result.upserted,
            "read": result.read,
            "skipped": result.skipped,
            "seconds": seconds,
            "summary": result.summary(),
            "backend_cpu": backend_cpu() - backend_start,
            "phases": {k: v for k, v in shown.items() if abs(v) >= 0.05},
            "calls": {
                k: calls.get(k, 0)
                for k in ("customers_upsert", "_upsert_columns", "_upsert", "customers_upsert: sql INSERT")
            },
        }
    )


def child_raw(slug: str, every: float) -> None:
    """The baseline: the same pages, COPY into a temporary table, one INSERT … ON CONFLICT."""
    connection = ErpConnection.objects.select_related("organization").get(organization__slug=slug)
    org_id = connection.organization_id
    phases = Phases()
    phases.instrument_client()
    state: dict[str, Any] = {"phase": "fetch + COPY", "rows": 0}
    backend_start = backend_cpu()
    ticker("baseline", state, every)
    quote = db.ops.quote_name
    meta = Customer._meta
    fields = [f for f in meta.local_concrete_fields if not f.primary_key]
    by_name = {f.name: f for f in fields}
    temp_columns = ", ".join(f"{quote(by_name[n].column)} {by_name[n].db_type(db)}" for n in COPIED)
    # The other columns as the model's defaults (what the sync writes for a new customer).
    select, params = [], []
    for f in fields:
        if f.name in COPIED:
            select.append(quote(f.column))
        elif f.name == "organization":
            select.append("%s")
            params.append(org_id)
        elif f.name in ("created_at", "updated_at"):
            select.append("now()")
        else:
            select.append("%s")
            params.append(f.get_db_prep_save(f.get_default(), db))
    updates = ["name", "email", "phone", "cpf_cnpj", "erp_trans_id", "erp_registered_at", "updated_at"]
    table = quote(meta.db_table)
    insert = (
        f"INSERT INTO {table} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608
        f"SELECT {', '.join(select)} FROM ("
        # A customer changed during the walk comes twice: keep its newest copy (as the sync ends up).
        f"SELECT DISTINCT ON (erp_id) * FROM erp_customer_load ORDER BY erp_id, erp_trans_id DESC) AS load "
        f"ON CONFLICT (organization_id, erp_id) DO UPDATE SET "
        + ", ".join(f"{c} = EXCLUDED.{c}" for c in updates)
        + f" WHERE {upserts._CUSTOMER_NEWER.format(t=table)}"
    )
    started = time.perf_counter()
    rows = high = 0
    with db.execute_wrapper(phases.sql), transaction.atomic(), db.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE erp_customer_load ({temp_columns}) ON COMMIT DROP")
        pg_cursor = cursor.cursor  # psycopg's own
        copy_seconds = 0.0
        with (
            services.erp_client(connection) as client,
            pg_cursor.copy(f"COPY erp_customer_load ({', '.join(COPIED)}) FROM STDIN") as copy,
        ):
            for page in client.customer_pages(trans_id=0, top=connection.page_size):
                t = time.perf_counter()
                for c in page.records:
                    copy.write_row(
                        (c.erp_id, c.name, c.email, c.phone, c.cpf_cnpj, c.trans_id, c.registered_at)
                    )
                copy_seconds += time.perf_counter() - t
                rows += len(page.records)
                high = max(high, page.next_trans_id)
                state["rows"] = rows
            t = time.perf_counter()
        copy_seconds += time.perf_counter() - t  # the end of the COPY (the last buffers)
        state["phase"] = "INSERT … SELECT"
        cursor.execute(insert, params)
        written = cursor.rowcount
        state["phase"] = "commit"
        ErpConnection.objects.filter(pk=connection.pk).update(
            customers_trans_id=high, customers_synced_at=timezone.now()
        )
    seconds = time.perf_counter() - started
    p = phases.seconds
    shown = {
        "http": p.pop("http", 0.0),
        "json": p.pop("json", 0.0),
        "parse records": p.pop("parse records", 0.0),
        "COPY rows": copy_seconds,
        "INSERT … SELECT … ON CONFLICT": p.pop("sql INSERT", 0.0),
        "commit": p.pop("commit", 0.0),
    }
    shown["other"] = seconds - sum(shown.values()) - sum(p.values())
    shown.update(p)
    emit(
        {
            "rows": rows,
            "written": written,
            "seconds": seconds,
            "backend_cpu": backend_cpu() - backend_start,
            "phases": {k: v for k, v in shown.items() if abs(v) >= 0.05},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000,1000000", help="customers per run, comma-separated")
    parser.add_argument("--page-size", type=int, default=1000, help="$top of every request (as the sync)")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between progress lines")
    parser.add_argument("--keep", action="store_true", help="keep the bench organizations' customers")
    parser.add_argument("--child", choices=["sync", "raw"], help=argparse.SUPPRESS)
    parser.add_argument("--org", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "sync":
        child_sync(args.org, args.every)
    elif args.child == "raw":
        child_raw(args.org, args.every)
    else:
        parent(args)


if __name__ == "__main__":
    main()
