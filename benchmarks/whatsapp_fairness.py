"""WhatsApp fairness: tenant B's small campaign started while tenant A's large one is sending.

    DATABASE_URL=postgres://…/crm_bench REDIS_URL=redis://…/13 SECRET_KEY=… ENCRYPTION_KEY=… \\
        .venv/bin/python benchmarks/whatsapp_fairness.py [--a-recipients 200000] [--b-recipients 500] \\
        [--latency 50] [--processes 2]

Both tenants send through the Meta sandbox (loopback, `--latency` ms per request), each from a
number of its own, no pacing, on the same `--processes` worker processes (`manage.py workers
--queues campaign-trigger,whatsapp-send`). B's completion (campaign_start → status sent) is
measured `--repeat` times alone (after a warm-up campaign of B), then as often one after the
other once A's campaign has sent `--a-head` of its messages (so A's send batches fill the
whatsapp-send queue). Prints B beside A over B alone (medians; target, issue 28: at most 2x) and
how many of A's messages were sent while B sent its own. Before B's runs beside A, A's sends/s
alone are measured over `--window` messages with its batches sent whole (as before the chunks)
and in chunks of `--chunk` (WHATSAPP_SEND_CHUNK), alternately `--throughput-rounds` times, on
fresh workers each (target: chunks at least 0.9x whole batches). Both tenants' campaigns are deleted at
the end (A's remaining batches find nothing to send). Keeps the `bench-<n>` organizations between
runs (benchmarks/whatsapp_campaign.py's world); flushes the Redis database.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
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

from benchmarks.common import ensure_database  # noqa: E402
from benchmarks.whatsapp_campaign import PHONE_NUMBER_ID, TOKEN, _delete_campaigns, ensure_world  # noqa: E402
from campaigns import lifecycle  # noqa: E402
from campaigns.models import Campaign, WhatsappMessage  # noqa: E402
from crm import jobs  # noqa: E402
from crm.models import Customer, Organization  # noqa: E402
from integrations import outbound  # noqa: E402
from integrations.models import WhatsappNumber  # noqa: E402
from project.sandboxes.whatsapp import SandboxServer  # noqa: E402

B_NUMBER_ID = "199999999988888"
TARGET = 2.0


def tenant_b(n: int, sandbox_url: str) -> Organization:
    """B: the `bench-<n>` world on a number of its own (call before A's ensure_world, which takes
    PHONE_NUMBER_ID back for A)."""
    org = ensure_world(n, sandbox_url)
    number = WhatsappNumber.objects.filter(phone_number_id=B_NUMBER_ID).first() or WhatsappNumber(
        phone_number_id=B_NUMBER_ID
    )
    number.organization, number.display_phone_number = org, "+5511930008888"
    number.graph_url, number.messages_per_second = sandbox_url, 0
    number.set_access_token(TOKEN)
    number.save()
    return org


def campaign(org: Organization, number_id: str, name: str) -> Campaign:
    return Campaign.objects.create(
        organization=org,
        name=name,
        whatsapp_number=WhatsappNumber.objects.get(phone_number_id=number_id),
        template_name="bench",
        template_variables=["first_name"],
    )


def sent(c: Campaign) -> int:
    return WhatsappMessage.objects.filter(campaign=c, status="sent").count()


def until_sent(c: Campaign, timeout: float = 1800) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        c.refresh_from_db(fields=["status"])
        if c.status == Campaign.Status.SENT:
            if not sent(c):
                raise SystemExit(f"{c.name} sent nothing (no audience?)")
            return time.monotonic() - started
        time.sleep(0.1)
    raise SystemExit(f"{c.name} not sent within {timeout:.0f} s")


def workers(processes: int, chunk: int) -> subprocess.Popen:
    argv = [sys.executable, str(ROOT / "manage.py"), "workers", "--processes", str(processes)]
    argv += ["--queues", "campaign-trigger,whatsapp-send", "--no-recover"]
    env = {**os.environ, "LOG_LEVEL": "WARNING", "WHATSAPP_SEND_CHUNK": str(chunk)}
    pool = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    time.sleep(3)  # workers up
    return pool


def stop(pool: subprocess.Popen) -> None:
    os.killpg(pool.pid, signal.SIGTERM)  # warm shutdown: the jobs under way end first
    pool.wait(timeout=120)


def sends_per_second(c: Campaign, window: int, timeout: float = 600) -> float:
    """A's sends/s over its next `window` messages (after 500 to warm the workers up)."""
    warm = sent(c) + 500
    started = time.monotonic()
    while sent(c) < warm and time.monotonic() - started < timeout:
        time.sleep(0.1)
    n0, t0 = sent(c), time.monotonic()
    while (n := sent(c)) < n0 + window:
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"A's campaign sent {n - n0} in {timeout:.0f} s: stuck?")
        time.sleep(0.1)
    return (n - n0) / (time.monotonic() - t0)


def throughput(big: Campaign, args: argparse.Namespace) -> subprocess.Popen:
    """A alone: sends/s with a batch sent whole (as before the chunks) and in chunks of
    `--chunk`, alternately; returns the pool running with `--chunk`."""
    batch = int(settings.WHATSAPP_BATCH_SIZE)
    rates: dict[int, list[float]] = {batch: [], args.chunk: []}
    pool = None
    for chunk in [batch, args.chunk] * args.throughput_rounds:
        pool = workers(args.processes, chunk)
        rate = sends_per_second(big, args.window)
        rates[chunk].append(rate)
        print(
            f"  A alone, {'whole batch' if chunk == batch else f'chunks of {chunk}'}: {rate:,.0f} sends/s "
            f"(load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
        if chunk != args.chunk or len(rates[chunk]) < args.throughput_rounds:
            stop(pool)
    before, after = statistics.median(rates[batch]), statistics.median(rates[args.chunk])
    print(
        f"A alone: whole batches {before:,.0f} sends/s, chunks of {args.chunk} {after:,.0f} sends/s: "
        f"{after / before:.2f}x (target >= 0.9x: {'met' if after >= 0.9 * before else 'NOT met'})",
        flush=True,
    )
    assert pool is not None
    return pool


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--a-recipients", type=int, default=200_000)
    parser.add_argument("--b-recipients", type=int, default=500)
    parser.add_argument("--a-head", type=int, default=1000, help="A's messages sent before B starts")
    parser.add_argument("--latency", type=int, default=50)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="B's campaigns alone, then beside A")
    parser.add_argument(
        "--chunk", type=int, default=int(settings.WHATSAPP_SEND_CHUNK), help="WHATSAPP_SEND_CHUNK"
    )
    parser.add_argument("--window", type=int, default=10_000, help="A's sends per throughput figure")
    parser.add_argument(
        "--throughput-rounds", type=int, default=2, help="A alone, whole batches then chunks, this many times"
    )
    args = parser.parse_args()
    ensure_database()
    numbers = {PHONE_NUMBER_ID: TOKEN, B_NUMBER_ID: TOKEN}
    with SandboxServer(host="127.0.0.1", port=0, numbers=numbers) as sandbox:
        outbound.trust_origin(sandbox.url)  # loopback: refused by the outbound guard unless trusted
        sandbox.configure(latency_ms=args.latency)
        org_b = tenant_b(args.b_recipients, sandbox.url)
        org_a = ensure_world(args.a_recipients, sandbox.url)
        for org in (org_a, org_b):
            _delete_campaigns(org)
            Customer.objects.filter(organization=org, marketing_consent=False).update(marketing_consent=True)
        print(
            f"scale: A {args.a_recipients:,} recipients, B {args.b_recipients:,}; sandbox {args.latency} ms; "
            f"{args.processes} worker processes; load {os.getloadavg()[0]:.1f}"
        )
        jobs.get_connection().flushdb()
        pool = workers(args.processes, args.chunk)
        try:
            until_sent(_start(campaign(org_b, B_NUMBER_ID, "B warm-up")))  # workers' first jobs import
            alone = [
                until_sent(_start(campaign(org_b, B_NUMBER_ID, f"B alone {i}"))) for i in range(args.repeat)
            ]
            print(f"  B alone measured (load {os.getloadavg()[0]:.1f})", flush=True)
            big = _start(campaign(org_a, PHONE_NUMBER_ID, "A large"))
            while not sent(big):  # fanned out (a worker stopped mid-fan-out would leave it to `recover`)
                time.sleep(0.2)
            if args.throughput_rounds:
                stop(pool)
                pool = throughput(big, args)
            while sent(big) < args.a_head:
                big.refresh_from_db(fields=["status"])
                if big.status == Campaign.Status.SENT:
                    raise SystemExit("A's campaign ended before B started: raise --a-recipients")
                time.sleep(0.2)
            a_before = sent(big)
            beside = [
                until_sent(_start(campaign(org_b, B_NUMBER_ID, f"B beside A {i}")))
                for i in range(args.repeat)
            ]
            a_during = sent(big) - a_before
            big.refresh_from_db(fields=["status"])
        finally:
            stop(pool)
            for org in (org_a, org_b):
                _delete_campaigns(org)
    ratio = statistics.median(beside) / statistics.median(alone)
    print(
        f"B alone: {', '.join(f'{t:.1f}' for t in alone)} s; B beside A's campaign: "
        f"{', '.join(f'{t:.1f}' for t in beside)} s -> median {ratio:.2f}x "
        f"(target <= {TARGET:.0f}x: {'met' if ratio <= TARGET else 'NOT met'}); "
        f"A sent {a_during:,} messages meanwhile, A's campaign {big.status} when B finished "
        f"(load {os.getloadavg()[0]:.1f})"
    )


def _start(c: Campaign) -> Campaign:
    lifecycle.campaign_start(campaign=c)
    return c


if __name__ == "__main__":
    main()
