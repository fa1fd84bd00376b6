"""WhatsApp campaign throughput against the Meta sandbox, with real worker processes.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/crm_bench REDIS_URL=redis://127.0.0.1:6379/13 \\
    SECRET_KEY=... ENCRYPTION_KEY=... .venv/bin/python benchmarks/whatsapp_campaign.py \\
        [--recipients 100000] [--latencies 0,200] [--rate 0] [--processes 2] [--baseline 2000] \\
        [--fanout-sizes 100000,1000000] [--states fresh,again,history] [--history 5000000] [--keep-history]

Uses (and creates if missing) the database in DATABASE_URL: migrates it, keeps a `bench-<n>`
organization with n customers between runs; every campaign of theirs is deleted at the end (none
is left for another run's workers to pick up), and the history too unless --keep-history. The
Redis database is flushed.

Parts 1 and 2 run in each of --states, in turn: `fresh` (no messages: earlier campaigns deleted,
the table vacuumed and analyzed empty, its indexes rebuilt), `again` (right after the state
before's campaign to the same audience: its fresh rows, the statistics as they are) and `history`
(last: --history sent messages over 90 days, written once with one INSERT … SELECT, then vacuumed
as autovacuum does a table after a bulk insert (as any 90-day-old row is: hint bits set, pages
all-visible) but not analyzed, kept between runs with --keep-history; the other states delete a
kept one first). The
fan-out runs with the contact caps at their defaults; the campaigns with them loosened (their runs
go to one audience one after the other).

1. Fan-out alone, for each of --fanout-sizes (default: --recipients): a campaign to n customers
   fanned out by one worker process serving campaign-trigger only (its send batches are left
   queued), timed by its JobRun: rows/s; the worker's resident memory before the job and its peak
   (VmHWM) during it. Against it, in the same run, a raw COPY of the same n rows (the same columns
   and values) from this process into a scratch table without indexes, and into one with the
   message table's indexes (LIKE ... INCLUDING ALL): rows/s.
2. For each latency, a whole campaign to --recipients customers with --processes workers: seconds
   to fan out, sustained sends/s (between 10% and 90% of the campaign), database queries per
   message, peak worker memory; then a naive baseline in the same run (one RQ job and one
   blocking request per message on RQ's default forking worker) on a smaller campaign. Pacing off
   (--rate 0), each campaign is followed by a plain aiohttp loop (benchmarks/raw_send_loop.py, its
   own process) of --recipients requests to the same sandbox at the same latency, the unpaced
   path's ceiling: its req/s and the campaign's ratio to it. --latencies '' skips this part.
3. With --store-numbers N (N > 0): the same campaign twice more in the same run, at the first
   latency, with every number paced at --rate (each number's tier; default 80/s): once from the
   campaign's single number, once from each customer's store number (N stores, each with its own
   number, every customer's latest sale at one of them, --store-rates giving each store number's
   tier in turn). Prints each number's sends/s (first to last send it made) against its tier, and
   the total. The sandbox listens on loopback: the benchmark trusts its origin (as `demo
   --graph-url` does), or the outbound guard would refuse every send.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django  # noqa: E402

django.setup()


from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from benchmarks.common import CpuAccount, ensure_database  # noqa: E402
from campaigns import lifecycle  # noqa: E402
from campaigns.models import Campaign, Sender, WhatsappMessage  # noqa: E402
from crm import bulk, jobs  # noqa: E402
from crm.checkpoints import jobrun_enqueue  # noqa: E402
from crm.models import Customer, JobRun, Organization, Store  # noqa: E402
from integrations import outbound  # noqa: E402
from integrations.models import WhatsappNumber  # noqa: E402
from integrations.whatsapp.client import TemplateMessage, UrlButton, build_payload  # noqa: E402
from project.sandboxes.whatsapp import SandboxServer  # noqa: E402

PHONE_NUMBER_ID = "199999999999999"
TOKEN = "bench-token"  # noqa: S105 - the sandbox's


def store_phone_number_id(i: int) -> str:
    return f"1999999999{i:05d}"


def ensure_world(n: int, sandbox_url: str, *, loosen_caps: bool = True) -> Organization:
    """The `bench-<n>` organization with exactly n customers (its earlier campaigns kept: the
    states decide), and the sandbox's WhatsApp number pointed at it. Its contact caps at their
    defaults, or loosened (`loosen_caps`: campaigns to one audience one after the other all send)."""
    org, _ = Organization.objects.get_or_create(slug=f"bench-{n}", defaults={"name": f"Benchmark {n}"})
    unsaved = Organization()  # the model's defaults
    count, days = (1000, 7) if loosen_caps else (unsaved.message_limit_count, unsaved.message_limit_days)
    Organization.objects.filter(pk=org.pk).update(
        message_limit_count=count,
        message_limit_days=days,
        block_multiple_campaigns=not loosen_caps,
        whatsapp_paused_at=None,
    )
    store, _ = Store.objects.get_or_create(organization=org, erp_code="B1", defaults={"name": "Bench"})
    have = Customer.objects.filter(organization=org).count()
    if have < n:
        added = bulk.copy_rows(
            Customer,
            ["organization_id", "erp_id", "name", "phone", "marketing_consent"],
            (
                (org.pk, f"B{i}", f"Cliente{i} Bench", f"+55119{10000000 + i:08d}", True)
                for i in range(have, n)
            ),
            ignore_conflicts=True,
        )
        bulk.analyze_if_grown(Customer, added)
    # Consent is never assumed (a customer without it is skipped): every bench customer gave it.
    Customer.objects.filter(organization=org, marketing_consent=False).update(marketing_consent=True)
    number = WhatsappNumber.objects.filter(phone_number_id=PHONE_NUMBER_ID).first() or WhatsappNumber(
        phone_number_id=PHONE_NUMBER_ID
    )
    if number.pk:  # other sizes' campaigns let go of it (a fresh database has none)
        Campaign.objects.filter(whatsapp_number=number).exclude(organization=org).update(whatsapp_number=None)
    number.organization, number.store, number.display_phone_number = org, store, "+5511930000000"
    number.graph_url, number.messages_per_second = sandbox_url, 0
    number.set_access_token(TOKEN)
    number.save()
    return org


def ensure_store_numbers(org: Organization, sandbox_url: str, rates: list[int]) -> list[WhatsappNumber]:
    """len(rates) stores, each with its own number at its rate, and one sale per customer (its
    store in turn): the world of a campaign sent from the customers' stores."""
    from decimal import Decimal

    from crm.models import Sale

    numbers = []
    for i, rate in enumerate(rates):
        store, _ = Store.objects.get_or_create(
            organization=org, erp_code=f"S{i:03d}", defaults={"name": f"Loja {i}"}
        )
        number = WhatsappNumber.objects.filter(
            phone_number_id=store_phone_number_id(i)
        ).first() or WhatsappNumber(phone_number_id=store_phone_number_id(i))
        number.organization, number.store = org, store
        number.display_phone_number = f"+55119300{i:05d}"
        number.graph_url, number.messages_per_second = sandbox_url, rate
        number.paused_at, number.paused_reason = None, ""
        number.set_access_token(TOKEN)
        number.save()
        Store.objects.filter(pk=store.pk).update(whatsapp_number=number)
        numbers.append(number)
    stores = [n.store_id for n in numbers]
    # Read before the COPY: copy_rows streams on this connection, which nothing may query meanwhile.
    customers = list(Customer.objects.filter(organization=org).order_by("pk").values_list("pk", flat=True))
    Sale.objects.filter(organization=org, erp_id__startswith="BS").exclude(store_id__in=stores).delete()
    added = bulk.copy_rows(
        Sale,
        ["organization_id", "store_id", "customer_id", "erp_id", "total", "sold_at"],
        (
            (org.pk, stores[i % len(stores)], pk, f"BS{pk}", Decimal("99.90"), timezone.now())
            for i, pk in enumerate(customers)
        ),
        ignore_conflicts=True,
    )
    bulk.analyze_if_grown(Sale, added)
    return numbers


def _delete_campaigns(org: Organization) -> None:
    # The messages with one statement (Django's cascade would load a million of them first), then
    # VACUUM, so that no run pays for the dead rows of the one before it.
    # An emptied table's indexes are rebuilt too: VACUUM leaves them their size (a deleted history's
    # 5,000,000 rows: indexes of 200-480 MB each), and a fresh state on them is not a fresh database's.
    table = WhatsappMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE organization_id = %s", [org.pk])  # noqa: S608
        if cursor.rowcount:
            cursor.execute(f"VACUUM ANALYZE {table}")
            cursor.execute(f"SELECT NOT EXISTS (SELECT FROM {table})")  # noqa: S608
            if cursor.fetchone()[0]:
                cursor.execute(f"REINDEX TABLE {table}")
    Campaign.objects.filter(organization=org).delete()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _peak_rss_mb(pids: list[int], field: str = "VmHWM") -> float:
    peak = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
    return peak / 1024


def raw_copy(org: Organization, n: int, *, indexed: bool) -> float:
    """rows/s of a plain COPY of the n rows a fan-out to `org` writes (the same columns and
    values), from this process into a scratch table; with the message table's indexes or none."""
    meta = WhatsappMessage._meta
    columns = [f for f in meta.concrete_fields if not f.primary_key]
    template = WhatsappMessage(campaign_id=0, organization_id=org.pk)
    values = [f.get_db_prep_save(getattr(template, f.attname), connection) for f in columns]
    at = {f.attname: i for i, f in enumerate(columns)}
    ids = list(Customer.objects.filter(organization=org).order_by("pk").values_list("pk", flat=True)[:n])
    names = ", ".join(f.column for f in columns)
    like = "INCLUDING ALL" if indexed else "INCLUDING DEFAULTS INCLUDING IDENTITY"
    with connection.cursor() as wrapper:
        cursor = wrapper.cursor
        # A table like the message table (WAL-logged, not a temporary one), dropped after.
        cursor.execute("DROP TABLE IF EXISTS bench_scratch")
        cursor.execute(f"CREATE TABLE bench_scratch (LIKE {meta.db_table} {like})")
        try:
            started = time.monotonic()
            with cursor.copy(f"COPY bench_scratch ({names}) FROM STDIN") as copy:
                row = list(values)
                for position, customer_id in enumerate(ids):
                    row[at["customer_id"]] = customer_id
                    row[at["batch"]] = position // 500
                    row[at["token"]] = secrets.token_urlsafe(16)
                    row[at["queued_at"]] = timezone.now()
                    copy.write_row(row)
            elapsed = time.monotonic() - started
        finally:
            cursor.execute("DROP TABLE bench_scratch")
    return len(ids) / elapsed


def run_fanout(org: Organization, *, n: int, batch: int, after_previous: bool = False) -> dict:
    """Fan a campaign to n recipients out on one worker process (campaign-trigger only); with
    `after_previous`, right after the last one (its rows queued, statistics as they are)."""
    if not after_previous:
        _delete_campaigns(org)
    redis = jobs.get_connection()
    redis.flushdb()
    campaign = Campaign.objects.create(
        organization=org,
        name=f"fan-out {n}{' again' if after_previous else ''}",
        whatsapp_number=WhatsappNumber.objects.get(phone_number_id=PHONE_NUMBER_ID),
        template_name="bench",
        template_variables=["first_name"],
    )
    env = {**os.environ, "WHATSAPP_BATCH_SIZE": str(batch), "LOG_LEVEL": "WARNING"}
    argv = [
        sys.executable,
        str(ROOT / "manage.py"),
        "workers",
        "--no-recover",
        "--queues",
        "campaign-trigger",
    ]
    worker = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        time.sleep(3)  # the worker up and idle
        _warm_up(org)
        pids = [worker.pid, *_children(worker.pid)]
        idle = _peak_rss_mb(pids, "VmRSS")
        cpu = CpuAccount(trees={"worker": worker.pid}, database=str(connection.settings_dict["NAME"]))
        cpu.start()
        lifecycle.campaign_start(campaign=campaign)
        runs = JobRun.objects.filter(kind="campaign-fanout", key=str(campaign.pk))
        deadline = time.monotonic() + 3600
        while not runs.filter(status__in=["completed", "failed"]).exists() and time.monotonic() < deadline:
            time.sleep(0.25)
        peak = _peak_rss_mb([*pids, *_children(worker.pid)])
        spent = cpu.stop()
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
    run = runs.get()
    rows = WhatsappMessage.objects.filter(campaign=campaign).count()
    seconds = (run.finished_at - run.started_at).total_seconds() if run.finished_at else float("nan")
    redis.flushdb()
    return {
        "status": run.status,
        "rows": rows,
        "seconds": seconds,
        "rows_per_s": rows / seconds if seconds else 0.0,
        "idle_mb": idle,
        "peak_mb": peak,
        "other_cores": spent["other"] / spent["wall"],
    }


def _warm_up(org: Organization) -> None:
    """One fan-out job on the worker before the measured one, as a worker has run before in
    production: its modules imported, its connections open (a finished campaign's: it writes
    nothing). Deleted after."""
    done = Campaign.objects.create(organization=org, name="warm-up", status=Campaign.Status.SENT)
    jobrun_enqueue(
        kind="campaign-fanout",
        key=str(done.pk),
        func="campaigns.tasks.campaign_fanout",
        queue="campaign-trigger",
        kwargs={"campaign_id": done.pk},
        organization_id=org.pk,
    )
    finished = JobRun.objects.filter(
        kind="campaign-fanout", key=str(done.pk), status__in=["completed", "failed"]
    )
    deadline = time.monotonic() + 600
    while not finished.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    done.delete()


HISTORY_CAMPAIGNS = 5  # each to every history customer once: 5 messages per customer over 90 days


def ensure_history(org: Organization, rows: int) -> float:
    """`rows` sent messages over the last 90 days (of HISTORY_CAMPAIGNS campaigns of a `bench-history`
    organization, to rows / HISTORY_CAMPAIGNS customers: the audience's first, then ids beyond
    every customer's), written with one INSERT … SELECT, then VACUUMed but not analyzed: rows as old
    as 90 days are (a fan-out right after the write would otherwise pay for setting the hint bits
    of the rows its caps read, once), statistics left stale. Kept between runs (reused when there);
    seconds spent writing them."""
    history, _ = Organization.objects.get_or_create(
        slug="bench-history", defaults={"name": "Benchmark history"}
    )
    table = WhatsappMessage._meta.db_table
    if WhatsappMessage.objects.filter(organization=history).count() == rows:
        return 0.0
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE organization_id = %s", [history.pk])  # noqa: S608
    Campaign.objects.filter(organization=history).delete()
    campaigns = [
        Campaign.objects.create(organization=history, name=f"history {k}", status=Campaign.Status.SENT)
        for k in range(HISTORY_CAMPAIGNS)
    ]
    audience = list(Customer.objects.filter(organization=org).order_by("pk").values_list("pk", flat=True))
    beyond = (Customer.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 1
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (campaign_id, organization_id, customer_id, batch, token, queued_at, "  # noqa: S608
            "status, error_reason, sent_at, attempts, phone, wa_id, cost, cost_currency) "
            "SELECT (%s::bigint[])[k], %s, CASE WHEN c < %s THEN (%s::bigint[])[c + 1] ELSE %s + c END, 0, "
            "left(md5(random()::text || c || '-' || k), 22), t, "
            "(ARRAY['sent', 'delivered', 'read'])[1 + c %% 3], "
            "'', t, 1, '', '', 0, '' FROM generate_series(0, %s) AS c, generate_series(1, %s) AS k, "
            "LATERAL (SELECT now() - random() * interval '90 days' + (c * 0) * interval '1 s' AS t) AS at",
            [
                [c.pk for c in campaigns],
                history.pk,
                len(audience),
                audience,
                beyond,
                rows // HISTORY_CAMPAIGNS - 1,
                HISTORY_CAMPAIGNS,
            ],
        )
        cursor.execute(f"VACUUM {table}")  # not ANALYZE: the statistics stay as they were
    return time.monotonic() - started


def delete_history() -> None:
    history = Organization.objects.filter(slug="bench-history").first()
    if history:
        _delete_campaigns(history)
        history.delete()


def run_campaign(
    org: Organization,
    sandbox: SandboxServer,
    *,
    n: int,
    latency: int,
    rate: int,
    processes: int,
    batch: int,
    sender: str = Sender.CAMPAIGN,
) -> dict:
    WhatsappNumber.objects.filter(phone_number_id=PHONE_NUMBER_ID).update(messages_per_second=rate)
    sandbox.reset()
    sandbox.configure(latency_ms=latency)
    redis = jobs.get_connection()
    redis.flushdb()
    campaign = Campaign.objects.create(
        organization=org,
        name=f"bench {n} @ {latency}ms from {sender}",
        whatsapp_number=WhatsappNumber.objects.get(phone_number_id=PHONE_NUMBER_ID),
        sender=sender,
        template_name="bench",
        template_variables=["first_name"],
    )
    env = {**os.environ, "CRM_COUNT_QUERIES": "1", "WHATSAPP_BATCH_SIZE": str(batch), "LOG_LEVEL": "WARNING"}
    pool = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "workers",
            "--processes",
            str(processes),
            "--queues",
            "campaign-trigger,whatsapp-send",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    marks: dict[str, float] = {}
    worker_pids: set[int] = set()
    try:  # whatever fails (an empty audience), the workers end with the run
        time.sleep(3)  # workers up
        cpu = CpuAccount(trees={"workers": pool.pid}, database=str(connection.settings_dict["NAME"]))
        cpu.start()
        started = time.monotonic()
        lifecycle.campaign_start(campaign=campaign)
        while True:
            time.sleep(0.25)
            worker_pids.update(c for p in _children(pool.pid) for c in [p, *_children(p)])
            accepted = sandbox.stats()["accepted"]
            elapsed = time.monotonic() - started
            if (
                "fanout" not in marks
                and JobRun.objects.filter(
                    kind="campaign-fanout", key=str(campaign.pk), status="completed"
                ).exists()
            ):
                marks["fanout"] = elapsed
            for frac in (0.1, 0.9):
                if f"p{frac}" not in marks and accepted >= frac * n:
                    marks[f"p{frac}"] = elapsed
            campaign.refresh_from_db(fields=["status"])
            if campaign.status == Campaign.Status.SENT or elapsed > 1800:
                break
        total = time.monotonic() - started
        memory = _peak_rss_mb(sorted(worker_pids))
        spent = cpu.stop()
    finally:
        os.killpg(pool.pid, signal.SIGTERM)
        pool.wait(timeout=60)
    sent = WhatsappMessage.objects.filter(campaign=campaign, status="sent").count()
    stats = sandbox.stats()
    sustained = 0.8 * n / (marks["p0.9"] - marks["p0.1"]) if "p0.9" in marks and "p0.1" in marks else 0.0
    return {
        "per_number": _per_number(sandbox.messages()),
        "sent": sent,
        "accepted": stats["accepted"],
        "by_recipient_max": stats["by_recipient_max"],
        "fanout_s": marks.get("fanout", 0.0),
        "total_s": total,
        "sustained": sustained,
        "queries_per_message": int(redis.get("crm:stats:db_queries") or 0) / max(n, 1),
        "peak_worker_mb": memory,
        "other_cores": spent["other"] / spent["wall"],
        # Where the campaign's CPU went, per message sent: the sandbox answers Meta's part in
        # this process (`client`).
        "cpu": cpu.per_request(spent, sent).removeprefix("CPU per request: "),
    }


def run_raw_loop(sandbox: SandboxServer, *, n: int, latency: int) -> float:
    """req/s of a plain aiohttp loop (benchmarks/raw_send_loop.py, its own process) POSTing n
    template messages like the campaign's to the same sandbox at `latency`: the unpaced path's
    ceiling, measured in the same run."""
    sandbox.reset()
    sandbox.configure(latency_ms=latency)
    message = TemplateMessage(
        to="5511910000000",
        template="bench",
        language="pt_BR",
        body=["Cliente1"],
        buttons=[UrlButton(0, "r/" + "x" * 40), UrlButton(1, "u/" + "x" * 40)],
        biz_opaque_callback_data="m:1",
    )
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "raw_send_loop.py"),
            "--url",
            sandbox.url,
            "--phone-number-id",
            PHONE_NUMBER_ID,
            "--token",
            TOKEN,
            "--messages",
            str(n),
            "--in-flight",
            str(settings.WHATSAPP_MAX_IN_FLIGHT),
            "--payload",
            json.dumps(build_payload(message)),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.split()[-1])


def _per_number(received: list[dict]) -> dict[str, tuple[int, float]]:
    """phone_number_id -> (sends, sends/s between its first and its last send)."""
    from datetime import datetime

    times: dict[str, list[datetime]] = {}
    for m in received:
        times.setdefault(m["phone_number_id"], []).append(datetime.fromisoformat(m["received_at"]))
    out = {}
    for number, at in sorted(times.items()):
        span = (max(at) - min(at)).total_seconds()
        out[number] = (len(at), (len(at) - 1) / span if span > 0 else 0.0)
    return out


def run_store_numbers(
    org: Organization, sandbox: SandboxServer, args: argparse.Namespace, latency: int
) -> None:
    """The campaign from its one number, then from N store numbers, each paced at its tier."""
    tiers = [int(x) for x in args.store_rates.split(",")] if args.store_rates else [args.rate or 80]
    rates = [tiers[i % len(tiers)] for i in range(args.store_numbers)]
    ensure_store_numbers(org, sandbox.url, rates)
    single_rate = args.rate or 80
    print(
        f"{args.recipients} recipients, {args.processes} worker processes, batch {args.batch}, "
        f"latency {latency} ms, every number paced at its tier"
    )
    for sender, label in ((Sender.CAMPAIGN, f"one number at {single_rate}/s"), (Sender.STORE, None)):
        r = run_campaign(
            org,
            sandbox,
            n=args.recipients,
            latency=latency,
            rate=single_rate,
            processes=args.processes,
            batch=args.batch,
            sender=sender,
        )
        label = label or f"{args.store_numbers} store numbers at {'/'.join(map(str, tiers))}/s"
        print(
            f"  from {label}: fan-out {r['fanout_s']:.1f} s, total {r['total_s']:.1f} s, "
            f"sustained {r['sustained']:.0f} sends/s, "
            f"sent {r['sent']}, max sends to one recipient {r['by_recipient_max']}"
        )
        for number, (count, per_s) in r["per_number"].items():
            tier = single_rate if number == PHONE_NUMBER_ID else rates[int(number[-5:])]
            against = f"its tier of {tier}/s ({per_s / tier:.2f}x)" if tier else "no tier (unpaced)"
            print(f"    {number}: {count} sends, {per_s:.1f} sends/s against {against}")


def run_baseline(org: Organization, sandbox: SandboxServer, *, n: int, latency: int, processes: int) -> float:
    sandbox.reset()
    sandbox.configure(latency_ms=latency)
    redis = jobs.get_connection()
    redis.flushdb()
    campaign = Campaign.objects.create(
        organization=org,
        name=f"naive {n}",
        template_name="bench",
        whatsapp_number=WhatsappNumber.objects.get(phone_number_id=PHONE_NUMBER_ID),
        status=Campaign.Status.SENDING,
    )
    customer_ids = list(
        Customer.objects.filter(organization=org).order_by("pk").values_list("pk", flat=True)[:n]
    )
    WhatsappMessage.objects.bulk_create(
        [WhatsappMessage(campaign=campaign, organization=org, customer_id=c) for c in customer_ids]
    )
    ids = list(WhatsappMessage.objects.filter(campaign=campaign).values_list("pk", flat=True))
    jobs.enqueue_many(
        "benchmarks.naive_send.send_one", queue="whatsapp-send", kwargs_list=[{"message_id": i} for i in ids]
    )
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "rqworker",
                "whatsapp-send",
                "--burst",
                "--worker-class",
                "rq.worker.Worker",
                "--serializer",
                "rq.serializers.JSONSerializer",
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]
    for p in procs:
        p.wait()
    elapsed = time.monotonic() - started
    return sandbox.stats()["accepted"] / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipients", type=int, default=100_000)
    parser.add_argument("--latencies", default="0,200")
    parser.add_argument("--rate", type=int, default=0, help="pacing per WhatsApp number (0 = off)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument(
        "--baseline", type=int, default=2000, help="recipients of the naive baseline (0 = skip)"
    )
    parser.add_argument(
        "--store-numbers",
        type=int,
        default=0,
        help="also compare the campaign from one number with it from N store numbers (0 = skip)",
    )
    parser.add_argument(
        "--skip-single",
        action="store_true",
        help="with --store-numbers: only that comparison (not part 2's runs per latency)",
    )
    parser.add_argument(
        "--store-rates",
        default="",
        help="the store numbers' tiers (sends/s), comma-separated, given in turn (default: --rate or 80)",
    )
    parser.add_argument(
        "--fanout-sizes",
        default="",
        help="audience sizes of the fan-out alone, comma-separated (default: --recipients; 0 = skip)",
    )
    parser.add_argument(
        "--states",
        default="fresh,again,history",
        help="the fan-out's states: fresh (no messages), again (right after a campaign to the same "
        "audience), history (--history messages over 90 days)",
    )
    parser.add_argument(
        "--history", type=int, default=5_000_000, help="messages of history (state 'history')"
    )
    parser.add_argument("--keep-history", action="store_true", help="keep the history for the next run")
    args = parser.parse_args()
    ensure_database()
    try:
        _main(args)
    finally:
        # Nothing left for another run's workers to pick up: every bench organization's campaigns.
        for org in Organization.objects.filter(slug__startswith="bench-").exclude(slug="bench-history"):
            _delete_campaigns(org)
        if not args.keep_history:
            delete_history()


def run_fanout_states(size: int, sandbox_url: str, *, states: list[str], batch: int, history: int) -> None:
    """The fan-out to `size` recipients in each state, the contact caps at their defaults, against
    raw COPYs of the same rows measured in the same run."""
    org = ensure_world(size, sandbox_url, loosen_caps=False)
    bare = raw_copy(org, size, indexed=False)
    indexed = raw_copy(org, size, indexed=True)
    for state in states:
        if state == "history":
            _delete_campaigns(org)
            spent = ensure_history(org, history)
            print(f"  history: {history:,} messages over 90 days ({spent:.0f} s to write; 0 = reused)")
        f = run_fanout(org, n=size, batch=batch, after_previous=state == "again")
        print(
            f"fan-out of {size} recipients, state {state} ({f['status']}, {f['rows']} rows, caps at "
            f"defaults): {f['seconds']:.1f} s, {f['rows_per_s']:,.0f} rows/s; raw COPY of the same rows: "
            f"{bare:,.0f} rows/s without indexes ({f['rows_per_s'] / bare:.2f}x), {indexed:,.0f} rows/s "
            f"with the message table's indexes ({f['rows_per_s'] / indexed:.2f}x); worker "
            f"{f['idle_mb']:.0f} MB idle, peak {f['peak_mb']:.0f} MB; other processes "
            f"{f['other_cores']:.1f} cores"
        )


def _main(args: argparse.Namespace) -> None:
    latencies = [int(x) for x in args.latencies.split(",") if x.strip()]
    states = [s for s in args.states.split(",") if s]
    with SandboxServer(host="127.0.0.1", port=0, numbers={PHONE_NUMBER_ID: TOKEN}) as sandbox:
        # The sandbox listens on loopback, which the outbound guard refuses unless an operator
        # trusts it (ALLOW_PRIVATE_OUTBOUND_URLS is off with a DATABASE_URL): every send would fail.
        outbound.trust_origin(sandbox.url)
        if args.store_numbers and latencies:
            numbers = {
                PHONE_NUMBER_ID: TOKEN,
                **{store_phone_number_id(i): TOKEN for i in range(args.store_numbers)},
            }
            with SandboxServer(host="127.0.0.1", port=0, numbers=numbers) as stores_sandbox:
                outbound.trust_origin(stores_sandbox.url)
                org = ensure_world(args.recipients, stores_sandbox.url)
                _delete_campaigns(org)
                run_store_numbers(org, stores_sandbox, args, latencies[0])
            if args.skip_single:
                return
        rates: dict[int, float] = {}
        # The history last: the other states have none.
        for state in sorted(states, key=lambda s: s == "history"):
            _run_state(args, sandbox, state, latencies, rates)
        if args.baseline:
            org = ensure_world(args.recipients, sandbox.url)
            for latency in rates:
                naive = run_baseline(org, sandbox, n=args.baseline, latency=latency, processes=args.processes)
                ratio = rates[latency] / naive if naive else float("inf")
                print(
                    f"  naive baseline @ {latency} ms ({args.baseline} msgs, one forking job each): "
                    f"{naive:.0f} sends/s -> batched is {ratio:.1f}x"
                )


def _run_state(
    args: argparse.Namespace,
    sandbox: SandboxServer,
    state: str,
    latencies: list[int],
    rates: dict[int, float],
) -> None:
    """Part 1 and 2 in one state: the fan-out alone at each size, then the campaign per latency."""
    if state != "history":
        delete_history()  # kept by an earlier run (--keep-history): these states have none
    fanout_sizes = [int(x) for x in (args.fanout_sizes or str(args.recipients)).split(",") if int(x)]
    for size in fanout_sizes:
        run_fanout_states(size, sandbox.url, states=[state], batch=args.batch, history=args.history)
    if not latencies:
        return
    org = ensure_world(args.recipients, sandbox.url)
    if state == "history":
        ensure_history(org, args.history)
    print(
        f"{args.recipients} recipients, {args.processes} worker processes, batch {args.batch}, "
        f"pacing {'off' if not args.rate else f'{args.rate}/s'}, contact caps loosened, state {state}"
    )
    for latency in latencies:
        if state != "again":
            _delete_campaigns(org)  # "again": right after the run before, to the same audience
        r = run_campaign(
            org,
            sandbox,
            n=args.recipients,
            latency=latency,
            rate=args.rate,
            processes=args.processes,
            batch=args.batch,
        )
        rates.setdefault(latency, r["sustained"])
        print(
            f"  state {state:>7}, latency {latency:>4} ms: fan-out {r['fanout_s']:.1f} s, "
            f"sustained {r['sustained']:.0f} sends/s, "
            f"total {r['total_s']:.1f} s, {r['queries_per_message']:.3f} queries/message, "
            f"peak worker {r['peak_worker_mb']:.0f} MB, sent {r['sent']}, "
            f"max sends to one recipient {r['by_recipient_max']}; CPU per message: {r['cpu']}"
        )
        if not args.rate:  # the unpaced path against a plain aiohttp loop to the same sandbox
            raw = run_raw_loop(sandbox, n=args.recipients, latency=latency)
            print(
                f"    raw aiohttp loop @ {latency} ms ({args.recipients} requests, "
                f"{settings.WHATSAPP_MAX_IN_FLIGHT} in flight, its own process): {raw:.0f} req/s -> "
                f"the campaign is {r['sustained'] / raw:.2f}x"
            )


if __name__ == "__main__":
    main()
