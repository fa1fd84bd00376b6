"""The unpaced send path's ceiling: a plain aiohttp loop POSTing template messages to the sandbox.

    .venv/bin/python benchmarks/raw_send_loop.py --url URL --phone-number-id ID --token T \\
        [--messages 20000] [--in-flight 500] [--payload JSON]

No database, no Redis, no Django: one process, one keep-alive pool of --in-flight connections, at
most --in-flight requests outstanding, every answer read. Prints `<requests> <seconds> <req/s>`.
`benchmarks/whatsapp_campaign.py` runs it in its own process (as a worker is) against the same
sandbox, at the same latency, right after each unpaced campaign: the ratio it prints is the
campaign's sustained sends/s over this loop's req/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp


async def send_all(
    url: str, phone_number_id: str, token: str, messages: int, in_flight: int, payload: dict
) -> float:
    """Seconds to POST `messages` copies of `payload` (each to its own recipient), `in_flight` at once."""
    endpoint = f"{url.rstrip('/')}/v23.0/{phone_number_id}/messages"
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(limit=in_flight, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        gate = asyncio.Semaphore(in_flight)

        async def one(i: int) -> None:
            body = {**payload, "to": f"55119{20000000 + i:08d}"}
            async with gate, session.post(endpoint, json=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"sandbox answered {response.status}")

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(messages)))
        return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--phone-number-id", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=500)
    parser.add_argument("--payload", default="", help="the message's JSON body (default: a minimal one)")
    args = parser.parse_args()
    payload = (
        json.loads(args.payload)
        if args.payload
        else {
            "messaging_product": "whatsapp",
            "type": "template",
            "template": {"name": "bench", "language": {"code": "pt_BR"}},
        }
    )
    seconds = asyncio.run(
        send_all(args.url, args.phone_number_id, args.token, args.messages, args.in_flight, payload)
    )
    print(f"{args.messages} {seconds:.3f} {args.messages / seconds:.1f}")


if __name__ == "__main__":
    main()
