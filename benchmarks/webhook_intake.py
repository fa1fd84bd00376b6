"""Webhook intake under a burst, against a trivial view on the same server in the same run.

    DATABASE_URL=postgres://…/crm_webhook_bench REDIS_URL=redis://…/11 SECRET_KEY=… ENCRYPTION_KEY=… \\
        .venv/bin/python benchmarks/webhook_intake.py [--statuses 10000] [--hooks 10000]

Starts the README's production webhook intake command (gunicorn crm.wsgi:application --workers
<cores> --threads 64 --keep-alive 75 --reuse-port) with one extra view, `/bench/trivial`
(benchmarks/bench_urls.py), and `manage.py workers --processes 2` (niced: in production they run
on machines of their own), then measures, each after the trivial view at the same concurrency on
the same server:
- Meta status webhooks, one status per signed POST, `--in-flight` (500) at a time: statuses
  accepted per second, the ratio to the trivial view, and acceptance → applied to its message
  (p50/p99, polled every 50 ms);
- runner webhooks (`POST /hooks/…`, bearer token, an X-Event-Id each, 5% sent twice),
  `--hook-in-flight` (1,000) at a time: requests per second, ratio, latency p50/p99 — twice: with
  this machine's workers stopped during the burst and started after it (the intake as deployed,
  its workers elsewhere: on 2 cores, the workers' PostgreSQL sessions, which nice cannot lower,
  compete with the intake), then with the workers draining on the same cores;
- that every accepted event was applied exactly once (each message delivered, the campaign's
  delivered counter equal to the statuses sent; one item per event id, each run once, every
  resend answered 200 `duplicate` with the first execution);
- where the CPU went, per request: the web server, the workers, the PostgreSQL sessions of the
  benchmark's database, this client, and what other processes on the machine took meanwhile.
Targets (issue 14): statuses ≥ 1,000/s and ≥ 0.5x trivial, applied within 2 s p99; runner ≥ 0.5x
trivial, p99 < 1 s.
With --replies-share F (issue 27), that share of the Meta POSTs are customers' replies instead of
statuses (benchmarks/conversations.py): stored once each, accepted -> in the Chatwoot sandbox
(--chatwoot-latency-ms, default 100) p50/p95/p99, a "PARAR" accepted -> opted out p99; targets:
the mix ≥ 0.5x trivial, Chatwoot p95 ≤ 5 s.

The database is created and migrated if missing; the benchmark's organization and Redis database
are wiped: point both at scratch ones.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

import django

django.setup()

import aiohttp  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from benchmarks import conversations  # noqa: E402
from benchmarks.common import CpuAccount, ensure_database  # noqa: E402
from benchmarks.runner_common import percentile, wait_for  # noqa: E402
from campaigns.models import Campaign, CampaignMetric, WhatsappMessage  # noqa: E402
from crm import jobs  # noqa: E402
from crm.models import Customer, Organization  # noqa: E402
from integrations.models import WhatsappNumber  # noqa: E402
from project.management.commands.up import manage_gunicorn  # noqa: E402
from runner.models import ExecutionItem, Handler, IntegrationType, RunnerSettings  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP_SECRET = "bench-meta-app-secret"  # noqa: S105 - a scratch deployment's
HOOK_TOKEN = "bench-runner-token-0123456789"  # noqa: S105
PORT = 8790


def web_command(workers: int, threads: int, port: int, *, reuse_port: bool = True) -> list[str]:
    """The README's production web command (the intake's: `reuse_port`), on a loopback port (no
    access log: it is measured)."""
    return [
        *manage_gunicorn(workers=workers, threads=threads, access_log=False, reuse_port=reuse_port),
        "--bind",
        f"127.0.0.1:{port}",
        "--backlog",
        "4096",
    ]


class Children:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
        out = open(ROOT / "var" / f"bench-{log}.log", "wb")  # noqa: SIM115 - the child's, closed by it
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def stop_one(self, proc: subprocess.Popen) -> None:
        """Stop one child as its supervisor would (SIGTERM: it finishes its jobs) and wait."""
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        self.procs.remove(proc)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def setup(n_messages: int) -> tuple[Campaign, list[str], Handler, Organization]:
    # Its campaign holds the replies' number (PROTECT): let go first.
    Campaign.objects.filter(organization__slug="bench-intake").update(whatsapp_number=None)
    Organization.objects.filter(slug="bench-intake").delete()
    org = Organization.objects.create(slug="bench-intake", name="Bench intake")
    campaign = Campaign.objects.create(organization=org, name="Bench", status=Campaign.Status.SENDING)
    CampaignMetric.objects.create(campaign=campaign, queued=n_messages, sent=n_messages)
    # The number the bodies name: the intake stores its organization with each event (fair share).
    WhatsappNumber.objects.filter(phone_number_id="1").delete()
    WhatsappNumber.objects.create(
        organization=org, display_phone_number="+5511970000000", phone_number_id="1"
    )
    people = Customer.objects.bulk_create(
        [
            Customer(organization=org, erp_id=f"B{i}", name=f"Cliente {i}", phone=f"+55119{70000000 + i}")
            for i in range(n_messages)
        ],
        batch_size=2000,
    )
    sent_at = timezone.now()
    messages = WhatsappMessage.objects.bulk_create(
        [
            WhatsappMessage(
                campaign=campaign,
                organization=org,
                customer=c,
                status=WhatsappMessage.Status.SENT,
                phone=c.phone,
                wa_id=c.phone.lstrip("+"),
                wamid=f"wamid.BENCH{c.pk}",
                sent_at=sent_at,
            )
            for c in people
        ],
        batch_size=2000,
    )
    it, _ = IntegrationType.objects.get_or_create(integration_key="bench-intake", defaults={"name": "Bench"})
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
            "webhook_auth": Handler.WebhookAuth.TOKEN,
        },
    )
    handler.set_webhook_secret(HOOK_TOKEN)
    handler.save()
    RunnerSettings.objects.update_or_create(organization=org, defaults={"rate_limit_per_minute": 10_000_000})
    return campaign, [m.wamid or "" for m in messages], handler, org


def meta_body(wamid: str, ts: int) -> bytes:
    status = {"id": wamid, "status": "delivered", "timestamp": str(ts), "recipient_id": "5511970000000"}
    value = {"messaging_product": "whatsapp", "metadata": {"phone_number_id": "1"}, "statuses": [status]}
    return json.dumps(
        {
            "object": "whatsapp_business_account",
            "entry": [{"id": "1", "changes": [{"field": "messages", "value": value}]}],
        }
    ).encode()


Answered = Callable[[int, int, float], None]


async def burst(
    base: str,
    requests: list[tuple[str, bytes, dict[str, str]]],
    in_flight: int,
    answered: Answered | None = None,
    firsts: set[int] | None = None,
) -> tuple[float, list[float], list[tuple[int, dict, float]]]:
    """POST every request, `in_flight` at a time; returns (seconds, latencies, [(status, JSON,
    answered at)]). `answered(i, status, at)` is told of each answer as it comes."""
    results: list[tuple[int, dict, float]] = [(0, {}, 0.0)] * len(requests)
    latencies: list[float] = [0.0] * len(requests)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)
    connector = aiohttp.TCPConnector(limit=in_flight, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)

    async def client(session: aiohttp.ClientSession) -> None:
        first = True
        while not queue.empty():
            i = queue.get_nowait()
            if first and firsts is not None:  # this request also opens the client's connection
                firsts.add(i)
            first = False
            path, body, headers = requests[i]
            start = time.monotonic()
            try:
                async with session.post(base + path, data=body, headers=headers) as response:
                    status, text = response.status, await response.read()
            except aiohttp.ClientError as exc:  # no answer: counted as status 0, never as accepted
                status, text = 0, json.dumps({"error": type(exc).__name__}).encode()
            latencies[i] = time.monotonic() - start
            try:
                payload = json.loads(text)
            except ValueError:
                payload = {}
            results[i] = (status, payload, time.time())
            if answered is not None:
                answered(i, status, results[i][2])

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.monotonic()
        await asyncio.gather(*(client(session) for _ in range(in_flight)))
        elapsed = time.monotonic() - start
    return elapsed, latencies, results


TRIVIAL = "/bench/trivial"  # through Django's full middleware, as every page
TRIVIAL_INTAKE = "/webhooks/bench-trivial"  # the same view on the intakes' lean stack (crm/wsgi.py)


def trivial(base: str, n: int, in_flight: int, path: str = TRIVIAL) -> float:
    return trivial_run(base, n, in_flight, path)[0]


def trivial_run(base: str, n: int, in_flight: int, path: str = TRIVIAL) -> tuple[float, float]:
    """The trivial view's requests/s and latency p99 (s) at that concurrency."""
    body = b'{"hello": "world"}'
    elapsed, latencies, results = asyncio.run(
        burst(base, [(path, body, {"Content-Type": "application/json"})] * n, in_flight)
    )
    bad = sum(1 for s, _, _ in results if s != 200)
    if bad:
        raise SystemExit(f"trivial view: {bad} answers were not 200")
    return n / elapsed, percentile(latencies, 99)


def _answers(base: str) -> bool:
    try:
        return trivial(base, 1, 1) > 0
    except (OSError, SystemExit, aiohttp.ClientError):
        return False


class AppliedPoller(threading.Thread):
    """Records when each accepted message is first seen delivered (polled every 50 ms, by wamid)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.waiting: dict[str, float] = {}  # wamid -> accepted at
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def accepted(self, wamid: str, at: float) -> None:
        with self.lock:
            self.waiting[wamid] = at

    def run(self) -> None:
        from django.db import connection as conn

        try:
            while not self.stop.is_set():
                with self.lock:
                    wanted = list(self.waiting)
                if wanted:
                    with conn.cursor() as cursor:
                        cursor.execute(
                            "SELECT wamid FROM campaigns_whatsappmessage "
                            "WHERE wamid = ANY(%s) AND status = 'delivered'",
                            [wanted],
                        )
                        now = time.time()
                        found = [wamid for (wamid,) in cursor.fetchall()]
                    with self.lock:
                        for wamid in found:
                            self.seen[wamid] = now - self.waiting.pop(wamid)
                time.sleep(0.05)
        finally:
            conn.close()


def meta_statuses(
    base: str,
    campaign: Campaign,
    wamids: list[str],
    in_flight: int,
    replies: tuple[float, Any] | None = None,
) -> dict:
    """The status burst; with `replies` (share, Chatwoot sandbox) that share of the POSTs replaced
    by customers' replies, measured apart (benchmarks/conversations.py)."""
    ts = int(time.time())
    share, cw = replies or (0.0, None)
    share = share if cw is not None else 0.0
    n_replies = int(len(wamids) * share)
    statuses, phones = wamids[n_replies:], [f"+55119{70000000 + i}" for i in range(n_replies)]
    requests = []
    for wamid in statuses:
        body = meta_body(wamid, ts)
        signature = "sha256=" + hmac.new(APP_SECRET.encode(), body, hashlib.sha256).hexdigest()
        requests.append(
            (
                "/webhooks/whatsapp/",
                body,
                {"Content-Type": "application/json", "X-Hub-Signature-256": signature},
            )
        )
    requests += [conversations.reply_request(APP_SECRET, p, i, ts) for i, p in enumerate(phones)]
    poller = AppliedPoller()
    poller.start()
    reply_poller = conversations.ReplyPoller(cw) if cw is not None else None
    if reply_poller is not None:
        reply_poller.start()

    def answered(i: int, status: int, at: float) -> None:
        if status != 200:
            return
        if i < len(statuses):
            poller.accepted(statuses[i], at)
        elif reply_poller is not None:
            k = i - len(statuses)
            with reply_poller.lock:
                reply_poller.accepted["PARAR" if k % 10 == 0 else f"reply {k}"] = at
                if k % 10 == 0:
                    reply_poller.opt_outs[phones[k]] = at

    elapsed, latencies, results = asyncio.run(burst(base, requests, in_flight, answered))
    accepted = sum(1 for s, _, _ in results[: len(statuses)] if s == 200)
    accepted_replies = sum(1 for s, _, _ in results[len(statuses) :] if s == 200)
    try:
        wait_for(lambda: len(poller.seen) >= accepted, timeout=300, what="every status applied")
        if reply_poller is not None:
            texts = len({f"reply {k}" for k in range(n_replies) if k % 10}) + (1 if n_replies else 0)
            wait_for(lambda: len(reply_poller.in_chatwoot) >= texts, timeout=600, what="replies in Chatwoot")
            wait_for(
                lambda: len(reply_poller.opted) >= len(reply_poller.opt_outs), timeout=300, what="opt-outs"
            )
    finally:
        poller.stop.set()
        poller.join()
        if reply_poller is not None:
            reply_poller.stop.set()
            reply_poller.join()
    lags = list(poller.seen.values())
    metric = CampaignMetric.objects.get(campaign=campaign)
    delivered = WhatsappMessage.objects.filter(campaign=campaign, status="delivered").count()
    return {
        "posts": len(requests),
        "accepted": accepted + accepted_replies,
        "answers": sorted({s for s, _, _ in results}),
        "per_second": (accepted + accepted_replies) / elapsed,
        "latency_p50": percentile(latencies, 50),
        "latency_p99": percentile(latencies, 99),
        "applied_p50": percentile(lags, 50),
        "applied_p99": percentile(lags, 99),
        "applied_max": max(lags) if lags else float("nan"),
        "exactly_once": metric.delivered == accepted == delivered,
        "counter": metric.delivered,
        "replies": None
        if reply_poller is None
        else conversations.figures(reply_poller, campaign.organization, accepted_replies),
    }


def runner_hooks(
    base: str,
    handler: Handler,
    n: int,
    in_flight: int,
    account: CpuAccount,
    after_burst: Callable[[], object],
) -> dict:
    path = f"/hooks/{handler.integration.integration_key}/{handler.handler_key}"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {HOOK_TOKEN}"}
    run = f"{time.time():.0f}"
    requests = [
        (path, json.dumps({"id": f"order-{i}", "total": i}).encode(), {**headers, "X-Event-Id": f"{run}-{i}"})
        for i in range(n)
    ]
    resent = list(range(0, n, 20))  # 5% sent again at the end of the burst
    requests += [requests[i] for i in resent]
    account.start()
    firsts: set[int] = set()
    elapsed, latencies, results = asyncio.run(burst(base, requests, in_flight, firsts=firsts))
    cpu = account.per_request(account.stop(), len(requests))
    after_burst()
    first = results[:n]
    accepted = [r for r in results if r[0] == 202]
    # A resend may be answered before its first delivery (both are in flight): one of the two is
    # accepted, the other answered duplicate, with the same execution.
    duplicates_ok = all(
        sorted((str(a[1].get("status")), str(b[1].get("status")))) == ["accepted", "duplicate"]
        and a[1].get("execution_id") == b[1].get("execution_id")
        for a, b in ((first[i], results[n + k]) for k, i in enumerate(resent))
        if a[0] and b[0]  # both answered
    )
    items = ExecutionItem.objects.filter(execution__handler=handler, external_id__startswith=f"{run}-")
    answered_ids = {
        requests[i][2]["X-Event-Id"] for i, (status, _, _) in enumerate(results) if status in (200, 202)
    }
    wait_for(
        lambda: items.filter(status="succeeded").count() >= len(answered_ids), timeout=600, what="items run"
    )
    time.sleep(2)  # an unanswered event may still be stored: let the drain finish
    per_event = Counter(items.values_list("external_id", flat=True))
    processed = items.filter(status="succeeded").count()
    unanswered = Counter(p.get("error", "?") for s, p, _ in results if s == 0)
    return {
        "posts": len(requests),
        "accepted": len(accepted),
        "unanswered": dict(unanswered),
        "answers": sorted({s for s, _, _ in results}),
        "per_second": len(requests) / elapsed,
        "latency_p50": percentile(latencies, 50),
        "latency_p99": percentile(latencies, 99),
        # Without each connection's first request (its TCP set-up in the burst's opening storm):
        # behind the TLS proxy, the intake sees the proxy's pooled connections.
        "connected_p99": percentile([t for i, t in enumerate(latencies) if i not in firsts], 99),
        "items": items.count(),
        # every event answered 2xx has one item, none has two, every item ran once
        "exactly_once": all(per_event[e] == 1 for e in answered_ids)
        and max(per_event.values(), default=1) == 1
        and processed == items.count()
        and duplicates_ok,
        "duplicates_ok": duplicates_ok,
        "cpu": cpu,
    }


def admin_cookie() -> dict[str, str]:
    """A logged-in staff session, as a browser holding it would send it."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    user_model = get_user_model()
    user_model.objects.filter(username="bench-admin").delete()
    user = user_model.objects.create_superuser("bench-admin", "bench@example.com.br", "x" * 20)
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return {settings.SESSION_COOKIE_NAME: session.session_key or ""}


async def _with_admin_load(
    admin_base: str,
    cookie: dict[str, str],
    requests: list[tuple[str, bytes, dict[str, str]]],
    base: str,
    n: int,
) -> tuple[float, list[float], int]:
    """The webhook burst while `n` clients keep loading the admin's message list; returns the
    burst's (seconds, latencies) and how many admin pages were served meanwhile."""
    stop = asyncio.Event()
    pages = 0

    async def browse(session: aiohttp.ClientSession) -> None:
        nonlocal pages
        while not stop.is_set():
            try:
                async with session.get(f"{admin_base}/admin/campaigns/whatsappmessage/") as response:
                    await response.read()
                    pages += response.status == 200
            except aiohttp.ClientError:
                pass

    async with aiohttp.ClientSession(cookies=cookie, timeout=aiohttp.ClientTimeout(total=120)) as session:
        browsers = [asyncio.create_task(browse(session)) for _ in range(n)]
        await asyncio.sleep(2)  # the admin is busy before the burst starts
        elapsed, latencies, _ = await burst(base, requests, 100)
        stop.set()
        await asyncio.gather(*browsers)
    return elapsed, latencies, pages


def isolation(main_base: str, intake_base: str, wamids: list[str], admin_clients: int) -> list[str]:
    """Meta webhook latency with the admin busy: sent to the admin's own server, and to the intake
    server (README: a separate gunicorn for /webhooks/ and /hooks/)."""
    cookie = admin_cookie()
    ts = int(time.time())
    requests = []
    for wamid in wamids:
        body = meta_body(wamid, ts)
        signature = "sha256=" + hmac.new(APP_SECRET.encode(), body, hashlib.sha256).hexdigest()
        requests.append(
            (
                "/webhooks/whatsapp/",
                body,
                {"Content-Type": "application/json", "X-Hub-Signature-256": signature},
            )
        )
    lines = []
    for label, base in (("the admin's server", main_base), ("the intake server", intake_base)):
        elapsed, latencies, pages = asyncio.run(
            _with_admin_load(main_base, cookie, requests, base, admin_clients)
        )
        lines.append(
            f"  webhooks to {label} while {admin_clients} clients load admin pages: "
            f"{len(requests) / elapsed:,.0f}/s, p50 {percentile(latencies, 50) * 1000:.0f} ms "
            f"p99 {percentile(latencies, 99) * 1000:.0f} ms ({pages:,} admin pages served meanwhile)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--statuses", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=500)
    parser.add_argument("--hooks", type=int, default=10_000)
    parser.add_argument("--hook-in-flight", type=int, default=1000)
    parser.add_argument("--web-workers", type=int, default=os.cpu_count() or 2, help="default: one per core")
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--worker-processes", type=int, default=2)
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--workers-nice", type=int, default=10)
    parser.add_argument(
        "--replies-share", type=float, default=0.2, help="share of Meta POSTs that are replies"
    )
    parser.add_argument("--chatwoot-latency-ms", type=float, default=100.0)
    parser.add_argument(
        "--isolation",
        type=int,
        default=0,
        metavar="N",
        help="also start the admin's web server (--workers 4 --threads 4) and compare webhook latency "
        "with N clients loading admin pages, sent to it and to the intake server",
    )
    args = parser.parse_args()

    ensure_database()
    (ROOT / "var").mkdir(exist_ok=True)
    jobs.get_connection().flushdb()
    campaign, wamids, handler, org = setup(args.statuses)
    cw = conversations.start(org, args.replies_share, args.chatwoot_latency_ms)
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="benchmarks.bench_settings",
        WHATSAPP_APP_SECRET=APP_SECRET,
        PYTHONPATH=str(ROOT),
        LOG_LEVEL="WARNING",
    )
    base = f"http://127.0.0.1:{args.port}"
    if _answers(base):  # another server (another run?) would take the requests
        raise SystemExit(f"something already answers on port {args.port}: stop it or pass --port")
    children = Children()
    try:
        web = children.start(web_command(args.web_workers, args.threads, args.port), env, "web")
        # Niced: in production the workers run on machines of their own; sharing this one, the web
        # processes come first, or the figures would measure the workers' CPU, not the intake.
        workers = [
            sys.executable,
            str(ROOT / "manage.py"),
            "workers",
            "--processes",
            str(args.worker_processes),
        ]
        account = CpuAccount(trees={"web": web.pid}, database=connection.settings_dict["NAME"])

        def start_drain() -> subprocess.Popen:
            proc = children.start(["nice", "-n", str(args.workers_nice), *workers], env, "workers")
            account.trees["workers"] = proc.pid
            return proc

        drain = start_drain()
        wait_for(lambda: _answers(base), timeout=60, what="gunicorn", every=0.5)
        connection.close()
        trivial(base, 2000, 100)  # warm every process and thread
        n = max(args.statuses, 2000)
        cpu: dict[str, str] = {}

        def measured(label: str, requests: int, run: Callable[[], Any]) -> Any:
            account.start()
            result = run()
            cpu[label] = account.per_request(account.stop(), requests)
            return result

        if args.statuses:
            base_meta = measured("trivial-meta", n, lambda: trivial(base, n, args.in_flight))
            mix = (args.replies_share, cw)
            meta = measured(
                "meta", args.statuses, lambda: meta_statuses(base, campaign, wamids, args.in_flight, mix)
            )
        if args.hooks:
            base_hooks, base_hooks_p99 = measured(
                "trivial-hooks", args.hooks, lambda: trivial_run(base, args.hooks, args.hook_in_flight)
            )
            lean_hooks, lean_hooks_p99 = measured(
                "lean-hooks",
                args.hooks,
                lambda: trivial_run(base, args.hooks, args.hook_in_flight, TRIVIAL_INTAKE),
            )
            # The intake as deployed (README: workers on machines of their own): this machine's
            # workers are stopped for the burst, so it measures the intake alone, and started
            # after it to apply what was accepted; then again with the workers draining alongside.
            children.stop_one(drain)
            hooks = runner_hooks(
                base,
                handler,
                args.hooks,
                args.hook_in_flight,
                account,
                start_drain,
            )
            shared = runner_hooks(base, handler, args.hooks, args.hook_in_flight, account, lambda: None)
        if args.isolation:
            children.start(web_command(4, 4, args.port + 1, reuse_port=False), env, "admin-web")
            main_base = f"http://127.0.0.1:{args.port + 1}"
            wait_for(lambda: _answers(main_base), timeout=60, what="the admin's gunicorn", every=0.5)
            isolated = isolation(main_base, base, wamids[:2000], args.isolation)
    finally:
        children.stop()
        conversations.stop(cw)

    print(
        f"web: gunicorn --workers {args.web_workers} --threads {args.threads}; "
        f"workers --processes {args.worker_processes}; load {os.getloadavg()[0]:.1f}"
    )
    if args.statuses:
        print(
            f"Meta statuses, 1 per POST, {args.in_flight} in flight: {meta['per_second']:,.0f} statuses/s "
            f"({meta['accepted']:,}/{meta['posts']:,} accepted, answers {meta['answers']}), "
            f"trivial view {base_meta:,.0f} req/s -> {meta['per_second'] / base_meta:.2f}x; "
            f"answer p50 {meta['latency_p50'] * 1000:.0f} ms p99 {meta['latency_p99'] * 1000:.0f} ms; "
            f"accepted -> applied p50 {meta['applied_p50'] * 1000:.0f} ms "
            f"p99 {meta['applied_p99'] * 1000:.0f} ms (max {meta['applied_max'] * 1000:.0f} ms); "
            f"applied exactly once: {meta['exactly_once']} (delivered counter {meta['counter']:,})"
            + conversations.summary(meta["replies"], args.replies_share, args.chatwoot_latency_ms)
        )
    if args.hooks:
        for label, run in (("workers on machines of their own", hooks), ("workers on these cores", shared)):
            print(
                f"Runner webhooks ({label}), {args.hook_in_flight} in flight: {run['per_second']:,.0f} req/s "
                f"({run['accepted']:,} accepted of {run['posts']:,} POSTs with 5% resends, "
                f"answers {run['answers']}, no answer {run['unanswered'] or 0}), "
                f"trivial view {base_hooks:,.0f} req/s (p99 {base_hooks_p99 * 1000:.0f} ms) "
                f"-> {run['per_second'] / base_hooks:.2f}x; "
                f"trivial view on the intake stack {lean_hooks:,.0f} req/s "
                f"(p99 {lean_hooks_p99 * 1000:.0f} ms) "
                f"-> {run['per_second'] / lean_hooks:.2f}x; "
                f"p50 {run['latency_p50'] * 1000:.0f} ms p99 {run['latency_p99'] * 1000:.0f} ms "
                f"(once connected: p99 {run['connected_p99'] * 1000:.0f} ms); "
                f"items {run['items']:,}, exactly once: {run['exactly_once']} "
                f"(resends answered duplicate: {run['duplicates_ok']})\n  burst {run['cpu']}"
            )
    for label, line in cpu.items():
        print(f"  {label}: {line}")
    if args.isolation:
        print("\n".join(["Isolation (Meta webhooks, 100 in flight):", *isolated]))


if __name__ == "__main__":
    main()
