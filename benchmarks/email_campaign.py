"""Email campaign throughput against the loopback SMTP sandbox, with real worker processes.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/crm_bench REDIS_URL=redis://127.0.0.1:6379/13 \\
    SECRET_KEY=... ENCRYPTION_KEY=... .venv/bin/python benchmarks/email_campaign.py \\
        [--emails 10000] [--rate 6000] [--processes 2] [--baseline 1000]

Uses (and creates if missing) the database in DATABASE_URL: migrates it and keeps a `bench-email-<n>`
organization with n customers between runs (its earlier campaigns are deleted first, so every run
sees the same history). The Redis database is flushed before every run. The SMTP sandbox (a real
aiosmtpd server on loopback, storing every email parsed in memory) runs in this process.

1. rate-limited: the organization's limit set to --rate emails per minute; a fresh campaign to all
   n customers (lifecycle.campaign_start), sent by `manage.py workers --processes N --burst`. The
   achieved rate comes from the times the sandbox received the emails: sustained (between the 10%
   and 90% emails) and overall, its deviation from the limit, the most emails in any 60 s window;
   SMTP connections opened per 1,000 emails, peak worker memory (VmHWM), fan-out time.
2. no limit: the same with messages_per_minute = 0: emails/s.
3. baseline in the same run (benchmarks/naive_email.py): one RQ job per email on RQ's default
   forking worker, a new SMTP connection per email, on --baseline emails.

For each run it also prints where the CPU went during the sustained phase (10% -> 90% of the
emails): the workers, this process (the sandbox's server thread, mostly), PostgreSQL, Redis and
every other process on the machine, in cores and in CPU milliseconds per email.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import email
import email.policy
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")
# Quiet here and in the workers: the sandbox (aiosmtpd's mail.log) would log every SMTP command.
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()


from benchmarks.common import ensure_database  # noqa: E402
from campaigns import lifecycle, selectors  # noqa: E402
from campaigns.models import BodyFormat, Campaign, Channel, EmailMessage  # noqa: E402
from crm import jobs  # noqa: E402
from crm.models import Customer, JobRun, Organization  # noqa: E402
from integrations.models import EmailSettings  # noqa: E402
from project.management.commands.demo_campaign import DEMO_EMAIL_BODY, DEMO_EMAIL_SUBJECT  # noqa: E402
from project.sandboxes.smtp import SmtpSandbox  # noqa: E402

SENDER = "ofertas@bench.example.com"
PROGRESS_EVERY = 5.0  # seconds between progress lines
POLL = 0.5  # seconds between looks at the sandbox, the campaign and the worker processes
TICKS = os.sysconf("SC_CLK_TCK")
CPUS = os.cpu_count() or 1


def ensure_world(n: int, sandbox: SmtpSandbox) -> Organization:
    # One organization per size, so the audience is exactly n customers.
    org, _ = Organization.objects.get_or_create(
        slug=f"bench-email-{n}", defaults={"name": f"Benchmark email {n}"}
    )
    # The limit per customer counts earlier campaigns' emails: as high as the field allows.
    Organization.objects.filter(pk=org.pk).update(
        message_limit_count=32767,
        block_multiple_campaigns=False,
        email_paused_at=None,
        email_paused_reason="",
    )
    # Earlier runs' campaigns (and their emails) go, so each invocation starts from the same history.
    Campaign.objects.filter(organization=org).delete()
    have = Customer.objects.filter(organization=org).count()
    for start in range(have, n, 10_000):
        Customer.objects.bulk_create(
            [
                Customer(
                    organization=org,
                    erp_id=f"E{i}",
                    name=f"Cliente{i} Bench",
                    email=f"cliente{i}@bench.example.com",
                    marketing_consent=True,
                )
                for i in range(start, min(start + 10_000, n))
            ],
            ignore_conflicts=True,
        )
    EmailSettings.objects.update_or_create(
        organization=org,
        defaults={
            "provider": EmailSettings.Provider.SMTP,
            "host": sandbox.host,
            "port": sandbox.port,
            "security": EmailSettings.Security.NONE,
            "username": "",
            "password_encrypted": "",
            "sender_name": "Ofertas Bench",
            "sender_email": SENDER,
            "unsubscribe_mailto": "descadastro@bench.example.com",
            "messages_per_minute": 0,
        },
    )
    return org


def new_campaign(org: Organization, name: str, **extra: Any) -> Campaign:
    """A fresh campaign each run, so no message is 'already sent'; the demo's MJML email."""
    return Campaign.objects.create(
        organization=org,
        name=name,
        channel=Channel.EMAIL,
        email_subject=DEMO_EMAIL_SUBJECT,
        email_body_format=BodyFormat.MJML,
        email_body=DEMO_EMAIL_BODY,
        **extra,
    )


# --- measuring processes -------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = _children(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        todo += _children(child)
    return out


def _stat_cpu(text: str) -> float:
    # utime + stime, and cutime + cstime: the children it has reaped (a forking worker's work
    # horses, the postmaster's exited backends).
    return sum(int(f) for f in text.rpartition(")")[2].split()[11:15]) / TICKS


def _cpu_seconds(pid: int) -> float | None:
    try:
        return _stat_cpu(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None


def _hwm_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (not idle or waiting for I/O) since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICKS


def _cpu_of_commands(*names: str) -> dict[str, float]:
    """CPU seconds of every process whose command starts with one of `names` (postgres, redis)."""
    out = dict.fromkeys(names, 0.0)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        command = text[text.find("(") + 1 : text.rfind(")")]
        for name in names:
            if command.startswith(name):
                out[name] += _stat_cpu(text)
    return out


@dataclass
class ProcessWatch:
    """Peak memory and CPU time of worker processes, read from /proc while they live (a --burst
    worker exits at the end, taking its numbers with it)."""

    roots: list[int]
    descend: bool  # True: the roots' descendants (a supervisor's workers); False: the roots themselves
    hwm_kb: dict[int, int] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)

    def poll(self) -> None:
        pids = [p for root in self.roots for p in _descendants(root)] if self.descend else self.roots
        for pid in pids:
            hwm, cpu = _hwm_kb(pid), _cpu_seconds(pid)
            if hwm is not None:
                self.hwm_kb[pid] = max(self.hwm_kb.get(pid, 0), hwm)
            if cpu is not None:
                self.cpu[pid] = max(self.cpu.get(pid, 0.0), cpu)

    @property
    def peak_mb(self) -> float:
        return max(self.hwm_kb.values(), default=0) / 1024

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())


@dataclass(frozen=True)
class Snapshot:
    wall: float
    received: int
    workers: float
    sandbox: float  # this process: the sandbox's server thread (and a poll every POLL seconds)
    postgres: float
    redis: float
    machine: float

    @classmethod
    def take(cls, watch: ProcessWatch, received: int) -> Snapshot:
        commands = _cpu_of_commands("postgres", "redis-server")
        return cls(
            wall=time.monotonic(),
            received=received,
            workers=watch.cpu_seconds,
            sandbox=time.process_time(),
            postgres=commands["postgres"],
            redis=commands["redis-server"],
            machine=_machine_busy_seconds(),
        )


@dataclass(frozen=True)
class CpuProfile:
    """CPU seconds by consumer between two snapshots."""

    seconds: float
    emails: int
    by: dict[str, float]  # workers, sandbox, postgres, redis, other, machine

    @classmethod
    def between(cls, a: Snapshot, b: Snapshot) -> CpuProfile:
        by = {
            "workers": b.workers - a.workers,
            "sandbox": b.sandbox - a.sandbox,
            "postgres": b.postgres - a.postgres,
            "redis": b.redis - a.redis,
            "machine": b.machine - a.machine,
        }
        by["other"] = max(by["machine"] - sum(v for k, v in by.items() if k != "machine"), 0.0)
        return cls(seconds=b.wall - a.wall, emails=b.received - a.received, by=by)

    def cores(self, who: str) -> float:
        return self.by[who] / max(self.seconds, 1e-9)

    def ms_per_email(self, who: str) -> float:
        return self.by[who] * 1000 / max(self.emails, 1)


# --- results -------------------------------------------------------------------------------


@dataclass
class Result:
    label: str
    limit_per_minute: int  # 0 = none
    statuses: dict[str, int]
    received: int
    sustained: float  # emails/s between the 10% and 90% emails
    overall: float  # emails/s between the first and the last email
    window_s: float  # first to last email received
    max_60s: int  # most emails received in any 60 s window
    max_1s: int  # most emails received in any 1 s window
    connections: int
    elapsed_s: float  # start of the run to done, worker start-up included
    first_email_s: float  # start of the run to the first email received
    fanout_s: float | None
    peak_worker_mb: float
    cpu: CpuProfile
    queries_per_email: float | None
    raw_sample: bytes = b""

    @property
    def per_1000(self) -> float:
        return self.connections * 1000 / max(self.received, 1)

    def deviation(self, rate: float) -> float | None:
        """Percent above (+) or below (-) the limit; None without a limit."""
        if not self.limit_per_minute:
            return None
        return (rate * 60 / self.limit_per_minute - 1) * 100


def _window_max(times: list[float], width: float) -> int:
    best = 0
    for i, t in enumerate(times):
        best = max(best, bisect.bisect_left(times, t + width, lo=i) - i)
    return best


def _received(sandbox: SmtpSandbox) -> int:
    # Cheap (no copy of the messages): the sandbox counts accepted emails per connection.
    return sum(sandbox.messages_per_connection().values())


def _wait(
    label: str,
    n: int,
    sandbox: SmtpSandbox,
    watch: ProcessWatch,
    started: float,
    done: Callable[[], bool],
    timeout: float,
) -> CpuProfile:
    """Poll until done(), printing progress every few seconds; the CPU profile of 10% -> 90%."""
    watch.poll()
    marks = {"start": Snapshot.take(watch, 0)}
    last_print = started
    while True:
        time.sleep(POLL)
        watch.poll()
        received = _received(sandbox)
        for name, frac in (("p10", 0.1), ("p90", 0.9)):
            if name not in marks and received >= frac * n:
                marks[name] = Snapshot.take(watch, received)
        now = time.monotonic()
        if done():
            break
        if now - last_print >= PROGRESS_EVERY:
            last_print = now
            print(f"    {label}: {received:>6} / {n} sent, {now - started:6.1f} s", flush=True)
        if now - started > timeout:
            print(f"    {label}: gave up after {timeout:.0f} s", flush=True)
            break
    marks["end"] = Snapshot.take(watch, _received(sandbox))
    if "p10" in marks and "p90" in marks and marks["p90"].wall - marks["p10"].wall > 1.0:
        return CpuProfile.between(marks["p10"], marks["p90"])
    return CpuProfile.between(marks["start"], marks["end"])


def _stop(proc: subprocess.Popen[bytes], *, group: bool) -> None:
    """Wait for a --burst worker to leave by itself; then SIGTERM it (its process group)."""
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.terminate()
        proc.wait(timeout=60)


def _show_log_if(failed: bool, log: IO[bytes], label: str) -> None:
    if failed:
        log.seek(0)
        tail = log.read().decode(errors="replace").splitlines()[-30:]
        print(f"  {label}: the workers' log ends with:\n    " + "\n    ".join(tail), flush=True)


def _fanout_seconds(campaign: Campaign) -> float | None:
    run = JobRun.objects.filter(kind="campaign-fanout", key=str(campaign.pk)).first()
    job = jobs.fetch_job(run.job_id) if run and run.job_id else None
    if job is None or job.started_at is None or job.ended_at is None:
        return None
    return (job.ended_at - job.started_at).total_seconds()


def _result(
    *,
    label: str,
    rate: int,
    campaign: Campaign,
    sandbox: SmtpSandbox,
    started_wall: float,
    elapsed: float,
    watch: ProcessWatch,
    cpu: CpuProfile,
    fanout_s: float | None,
    queries_per_email: float | None,
) -> Result:
    messages = sandbox.messages()
    times = sorted(m["received_at"].timestamp() for m in messages)
    n = len(times)
    sustained = overall = window = 0.0
    if n >= 2:
        lo, hi = int(0.1 * n), max(int(0.9 * n) - 1, int(0.1 * n) + 1)
        sustained = (hi - lo) / max(times[hi] - times[lo], 1e-9)
        window = times[-1] - times[0]
        overall = (n - 1) / max(window, 1e-9)
    counts = selectors.campaign_counts(campaign_id=campaign.pk, channel=Channel.EMAIL)
    return Result(
        label=label,
        limit_per_minute=rate,
        statuses={k: v for k, v in counts.items() if v},
        received=n,
        sustained=sustained,
        overall=overall,
        window_s=window,
        max_60s=_window_max(times, 60.0),
        max_1s=_window_max(times, 1.0),
        connections=sandbox.connections(),
        elapsed_s=elapsed,
        first_email_s=times[0] - started_wall if times else 0.0,
        fanout_s=fanout_s,
        peak_worker_mb=watch.peak_mb,
        cpu=cpu,
        queries_per_email=queries_per_email,
        raw_sample=messages[n // 2]["raw"] if messages else b"",
    )


def run_campaign(
    org: Organization, sandbox: SmtpSandbox, *, label: str, n: int, rate: int, processes: int
) -> Result:
    EmailSettings.objects.filter(organization=org).update(
        messages_per_minute=rate, host=sandbox.host, port=sandbox.port
    )
    sandbox.reset()
    redis = jobs.get_connection()
    redis.flushdb()
    campaign = new_campaign(org, f"bench email {n} @ {f'{rate}/min' if rate else 'no limit'}")
    env = {**os.environ, "CRM_COUNT_QUERIES": "1", "LOG_LEVEL": "WARNING"}
    with tempfile.TemporaryFile() as log:
        started, started_wall = time.monotonic(), time.time()
        lifecycle.campaign_start(campaign=campaign)  # the fan-out job waits on campaign-trigger
        pool = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "workers",
                "--processes",
                str(processes),
                "--burst",
                "--queues",
                "campaign-trigger,email-send",
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        watch = ProcessWatch([pool.pid], descend=True)

        def done() -> bool:
            campaign.refresh_from_db(fields=["status"])
            return campaign.status != Campaign.Status.SENDING or pool.poll() is not None

        try:
            timeout = max(600.0, 3 * n * 60 / rate if rate else n / 5)
            cpu = _wait(label, n, sandbox, watch, started, done, timeout=timeout)
            elapsed = time.monotonic() - started
            _stop(pool, group=True)
        finally:
            if pool.poll() is None:
                os.killpg(pool.pid, signal.SIGTERM)
                pool.wait(timeout=60)
        campaign.refresh_from_db(fields=["status"])
        _show_log_if(campaign.status != Campaign.Status.SENT or pool.returncode != 0, log, label)
    return _result(
        label=label,
        rate=rate,
        campaign=campaign,
        sandbox=sandbox,
        started_wall=started_wall,
        elapsed=elapsed,
        watch=watch,
        cpu=cpu,
        fanout_s=_fanout_seconds(campaign),
        queries_per_email=int(redis.get("crm:stats:db_queries") or 0) / max(n, 1),
    )


def run_baseline(org: Organization, sandbox: SmtpSandbox, *, n: int, processes: int) -> Result:
    EmailSettings.objects.filter(organization=org).update(
        messages_per_minute=0, host=sandbox.host, port=sandbox.port
    )
    sandbox.reset()
    jobs.get_connection().flushdb()
    campaign = new_campaign(org, f"naive email {n}", status=Campaign.Status.SENDING)
    customer_ids = list(
        Customer.objects.filter(organization=org).order_by("pk").values_list("pk", flat=True)[:n]
    )
    EmailMessage.objects.bulk_create(
        [EmailMessage(campaign=campaign, organization=org, customer_id=c) for c in customer_ids]
    )
    ids = list(EmailMessage.objects.filter(campaign=campaign).values_list("pk", flat=True))
    jobs.enqueue_many(
        "benchmarks.naive_email.send_one", queue="email-send", kwargs_list=[{"message_id": i} for i in ids]
    )
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    with tempfile.TemporaryFile() as log:
        started, started_wall = time.monotonic(), time.time()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "manage.py"),
                    "rqworker",
                    "email-send",
                    "--burst",
                    "--worker-class",
                    "rq.worker.Worker",
                    "--serializer",
                    "rq.serializers.JSONSerializer",
                ],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            for _ in range(processes)
        ]
        watch = ProcessWatch([p.pid for p in procs], descend=False)
        try:
            cpu = _wait(
                "baseline",
                len(ids),
                sandbox,
                watch,
                started,
                lambda: all(p.poll() is not None for p in procs),
                timeout=1800.0,
            )
            elapsed = time.monotonic() - started
        finally:
            for p in procs:
                if p.poll() is None:
                    _stop(p, group=False)
        _show_log_if(_received(sandbox) < len(ids), log, "baseline")
    Campaign.objects.filter(pk=campaign.pk).update(status=Campaign.Status.SENT)
    return _result(
        label="baseline",
        rate=0,
        campaign=campaign,
        sandbox=sandbox,
        started_wall=started_wall,
        elapsed=elapsed,
        watch=watch,
        cpu=cpu,
        fanout_s=None,
        queries_per_email=None,
    )


def sandbox_parse_ms(raw: bytes, repeat: int = 300) -> float:
    """What the sandbox does with every accepted email besides the SMTP dialogue (parse it, find its
    text and HTML parts), timed here on one stored email."""
    if not raw:
        return 0.0
    started = time.process_time()
    for _ in range(repeat):
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        for subtype in ("plain", "html"):
            part = parsed.get_body(preferencelist=(subtype,))
            if part is not None:
                part.get_content()
    return (time.process_time() - started) / repeat * 1000


# --- output --------------------------------------------------------------------------------


def _details(r: Result) -> None:
    fanout = f"fan-out {r.fanout_s:.2f} s, " if r.fanout_s is not None else ""
    queries = f", {r.queries_per_email:.3f} queries/email" if r.queries_per_email is not None else ""
    print(
        f"  {r.label}: {r.received} received, statuses {r.statuses}; elapsed {r.elapsed_s:.1f} s "
        f"(first email after {r.first_email_s:.1f} s, worker start-up included), {fanout}"
        f"first-to-last {r.window_s:.1f} s; sustained {r.sustained:.1f}/s, overall {r.overall:.1f}/s; "
        f"most in any 60 s {r.max_60s}, in any 1 s {r.max_1s}; {r.connections} SMTP connections"
        f"{queries}"
    )
    c = r.cpu
    names = {
        "workers": "workers",
        "sandbox": "this process (sandbox)",
        "postgres": "postgres (all databases)",
        "redis": "redis",
        "other": "other processes",
    }
    print(
        f"    CPU from the 10% to the 90% email ({c.seconds:.1f} s, {c.emails} emails), cores: "
        + ", ".join(f"{label} {c.cores(w):.2f}" for w, label in names.items())
        + f"; machine {c.cores('machine'):.2f} of {CPUS}. CPU ms per email: "
        + ", ".join(f"{w} {c.ms_per_email(w):.1f}" for w in ("workers", "sandbox", "postgres"))
    )


def _row(r: Result) -> str:
    deviation = r.deviation(r.sustained)
    limit = f"{r.limit_per_minute}/min" if r.limit_per_minute else "none"
    dev = f"{deviation:+.1f}%" if deviation is not None else "-"
    return (
        f"{r.label:<26} {r.received:>7} {r.sustained:>9.1f} {limit:>10} {dev:>9} "
        f"{r.per_1000:>10.1f} {r.peak_worker_mb:>9.0f}"
    )


def summary(results: list[Result], *, rate: int, processes: int, parse_ms: float) -> None:
    print()
    print(
        f"{'run':<26} {'emails':>7} {'emails/s':>9} {'limit':>10} {'deviation':>9} "
        f"{'conn/1000':>10} {'worker MB':>9}"
    )
    for r in results:
        print(_row(r))
    print("  (emails/s: sustained, between the 10% and 90% emails as the sandbox received them)")
    limited = next((r for r in results if r.limit_per_minute), None)
    free = next((r for r in results if not r.limit_per_minute and r.label != "baseline"), None)
    base = next((r for r in results if r.label == "baseline"), None)
    if limited is not None:
        dev_sustained = limited.deviation(limited.sustained) or 0.0
        dev_overall = limited.deviation(limited.overall) or 0.0
        verdict = "within" if abs(dev_sustained) <= 5 and abs(dev_overall) <= 5 else "OUTSIDE"
        print(
            f"rate limit {rate}/min = {rate / 60:.1f}/s: sustained {limited.sustained * 60:.0f}/min "
            f"({dev_sustained:+.1f}%), overall {limited.overall * 60:.0f}/min ({dev_overall:+.1f}%), "
            f"at most {limited.max_60s} in any 60 s: {verdict} ±5%"
        )
        if verdict != "within":
            c = limited.cpu
            print(
                f"  during it the machine was {c.cores('machine') / CPUS * 100:.0f}% busy, "
                f"{c.cores('other'):.2f} cores taken by other processes; each worker had "
                f"{processes * 1000 / max(limited.sustained, 1e-9):.1f} ms per email "
                f"(the limit needs {processes * 60_000 / rate:.1f} ms)"
            )
            if free is not None and 0 < free.sustained < rate / 60 * 1.05:
                print(
                    f"  the no-limit run reached only {free.sustained:.1f}/s: this machine cannot send "
                    "much faster than the limit, so the deviation measures capacity, not the limiter"
                )
    if free is not None and base is not None and base.sustained:
        print(
            f"no limit: {free.sustained:.1f} emails/s vs baseline {base.sustained:.1f} emails/s "
            f"-> {free.sustained / base.sustained:.1f}x; connections per 1,000 emails "
            f"{free.per_1000:.1f} vs {base.per_1000:.1f}"
        )
    if free is not None and parse_ms:
        sandbox_ms = free.cpu.ms_per_email("sandbox")
        workers_ms = free.cpu.ms_per_email("workers")
        busy = free.cpu.cores("machine") / CPUS
        costly = sandbox_ms >= 0.5 * workers_ms
        print(
            f"sandbox: {sandbox_ms:.1f} ms of CPU per email in the no-limit run, against "
            f"{workers_ms:.1f} ms in the workers (it parses a message only when read, {parse_ms:.1f} ms "
            f"each, after the run); its one thread alone caps it near {1000 / max(sandbox_ms, 1e-9):.0f}/s"
            + (
                f". With the machine {busy * 100:.0f}% busy, the sandbox's share of the CPU is part of "
                "the no-limit bottleneck"
                if costly and busy > 0.85
                else ""
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--emails", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=6000, help="the organization's limit, emails/minute")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--baseline", type=int, default=1000, help="emails of the naive baseline (0 = skip)")
    args = parser.parse_args()
    ensure_database()
    with SmtpSandbox(host="127.0.0.1", port=0) as sandbox:
        org = ensure_world(args.emails, sandbox)
        print(
            f"{args.emails} emails to the SMTP sandbox on {sandbox.host}:{sandbox.port}, "
            f"{args.processes} worker processes, {CPUS} CPUs, organization {org.slug}",
            flush=True,
        )
        runs = [(f"1 limit {args.rate}/min", args.rate)] if args.rate else []
        runs.append(("2 no limit", 0))
        results: list[Result] = []
        for label, rate in runs:
            print(f"  run {label} ...", flush=True)
            r = run_campaign(org, sandbox, label=label, n=args.emails, rate=rate, processes=args.processes)
            results.append(r)
            _details(r)
            if r.received < args.emails:
                print(f"  WARNING: only {r.received} of {args.emails} emails reached the sandbox", flush=True)
        parse_ms = sandbox_parse_ms(results[-1].raw_sample)
        if args.baseline:
            print("  baseline: one forking job and one SMTP connection per email ...", flush=True)
            r = run_baseline(org, sandbox, n=min(args.baseline, args.emails), processes=args.processes)
            results.append(r)
            _details(r)
        summary(results, rate=args.rate, processes=args.processes, parse_ms=parse_ms)


if __name__ == "__main__":
    main()
