"""CPU a request of the send path's POST pool (integrations/http_pool.py) against aiohttp.

    .venv/bin/python benchmarks/http_clients.py [--requests 20000] [--in-flight 500] [--rounds 2]

No database, no Redis. The Meta sandbox listens in a process of its own (0 ms latency); each
client posts --requests template messages (the campaign's payload, each to its own recipient)
with --in-flight outstanding, in a process of its own, and prints its req/s and the CPU it spent a
request (user + system, after a warm-up of 1,000): `pool` as integrations.whatsapp.client.GraphClient
sends (json.dumps, PostPool.post, json.loads), `aiohttp` as the send path did before the pool
(a ClientSession with the seam's timeouts and headers, `json=`, the answer read in chunks and
parsed). Rounds alternate the clients; the host's speed varies, so compare within a round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _button(index: int, text: str) -> dict:
    return {
        "type": "button",
        "sub_type": "url",
        "index": str(index),
        "parameters": [{"type": "text", "text": text}],
    }


PAYLOAD = {
    "messaging_product": "whatsapp",
    "recipient_type": "individual",
    "to": "5511910000000",
    "type": "template",
    "template": {
        "name": "bench",
        "language": {"code": "pt_BR"},
        "components": [
            {"type": "body", "parameters": [{"type": "text", "text": "Cliente1"}]},
            *(
                {
                    "type": "button",
                    "sub_type": "url",
                    "index": str(i),
                    "parameters": [{"type": "text", "text": t}],
                }
                for i, t in enumerate(("r/" + "x" * 70, "u/" + "x" * 70))
            ),
        ],
    },
    "biz_opaque_callback_data": "m:1",
}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _aiohttp_client(url: str, in_flight: int):
    import aiohttp

    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=30.0, connect=5.0, sock_connect=5.0, sock_read=20.0),
        headers={"User-Agent": "crm-queue-platform/0.1"},
        connector=aiohttp.TCPConnector(limit=in_flight, limit_per_host=0),
    )

    async def send(body: dict) -> None:
        async with session.post(
            url, json=body, headers={"Authorization": "Bearer t"}, allow_redirects=False
        ) as response:
            response.headers.get("Retry-After")
            answer = bytearray()
            async for chunk in response.content.iter_any():
                answer += chunk
            json.loads(answer)

    return send, session.close


async def _pool_client(url: str, in_flight: int):
    from integrations.http_pool import PostPool

    base, _, path = url.partition("/v23.0")
    pool = PostPool(base, limit=in_flight, headers={"User-Agent": "crm-queue-platform/0.1"})
    headers = {"Content-Type": "application/json", "Authorization": "Bearer t"}

    async def send(body: dict) -> None:
        data = json.dumps(body, separators=(",", ":")).encode("ascii")
        answer = await pool.post("/v23.0" + path, data, headers)
        answer.headers.get("retry-after")
        json.loads(answer.body)

    return send, pool.close


async def _run(client: str, url: str, requests: int, in_flight: int) -> tuple[float, float]:
    make = _pool_client if client == "pool" else _aiohttp_client
    send, close = await make(url, in_flight)
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with gate:
            await send({**PAYLOAD, "to": f"55119{20000000 + i:08d}"})

    await asyncio.gather(*(one(i) for i in range(1000)))  # connections open, code warm
    cpu, started = _cpu(), time.monotonic()
    await asyncio.gather(*(one(i) for i in range(requests)))
    cpu, seconds = _cpu() - cpu, time.monotonic() - started
    await close()
    return requests / seconds, cpu / requests


def _client_process(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from django.conf import settings

    # The guard lets the loopback sandbox through (as a deployment that allows private addresses):
    # no database, no trusted origins to read.
    settings.configure(ALLOW_PRIVATE_OUTBOUND_URLS=True)
    rate, cpu = asyncio.run(_run(args.client, args.url, args.requests, args.in_flight))
    print(f"{rate} {cpu}")


def _sandbox_process() -> None:
    sys.path.insert(0, str(ROOT))
    from project.sandboxes.whatsapp import SandboxServer

    server = SandboxServer(host="127.0.0.1", port=0).start()
    print(server.url, flush=True)
    sys.stdin.read()  # until the benchmark ends
    server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--sandbox", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sandbox:
        return _sandbox_process()
    if args.client:
        return _client_process(args)
    me = [sys.executable, __file__]
    sandbox = subprocess.Popen([*me, "--sandbox"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert sandbox.stdout is not None
        url = sandbox.stdout.readline().strip() + "/v23.0/123/messages"
        load = os.getloadavg()[0]
        print(f"{args.requests} requests, {args.in_flight} in flight, sandbox at 0 ms (load {load:.1f})")
        for n in range(1, args.rounds + 1):
            figures = {}
            for client in ("aiohttp", "pool"):
                out = subprocess.run(
                    [
                        *me,
                        "--client",
                        client,
                        "--url",
                        url,
                        "--requests",
                        str(args.requests),
                        "--in-flight",
                        str(args.in_flight),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.split()
                figures[client] = (float(out[0]), float(out[1]))
            line = ", ".join(
                f"{c} {r:,.0f} req/s, {1e6 * cpu:.0f} µs CPU a request" for c, (r, cpu) in figures.items()
            )
            ratio = figures["pool"][1] / figures["aiohttp"][1]
            print(f"round {n}: {line} -> the pool's CPU is {ratio:.2f}x aiohttp's")
    finally:
        sandbox.communicate("")


if __name__ == "__main__":
    main()
