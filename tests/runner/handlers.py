"""In-process handlers for the runner's tests; their behaviour is steered through Redis so worker
processes see it too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from crm.jobs import get_connection
from integrations.errors import IntegrationError
from integrations.runner.contract import ItemIn, RunIn


def produce(run: RunIn) -> Iterator[dict[str, Any]]:
    n = int(get_connection().get("runner:test:produce") or 3)
    for i in range(n):
        yield {"external_id": f"e{i}", "payload": {"i": i}}


def process(item: ItemIn) -> dict[str, Any]:
    conn = get_connection()
    if conn.sismember("runner:test:reject", item.external_id):
        raise IntegrationError("rejected for good", retryable=False)
    if conn.hincrby("runner:test:fail", item.external_id, -1) >= 0:
        raise IntegrationError("temporarily down", retryable=True)
    conn.rpush("crm:test:processed", item.external_id)
    return {"ok": item.external_id}


class noop:
    @staticmethod
    def produce(run: RunIn) -> Iterator[dict[str, Any]]:
        n = int(get_connection().get("runner:test:produce") or 3)
        return ({"external_id": str(i), "payload": {}} for i in range(n))

    @staticmethod
    def process(item: ItemIn) -> None:
        return None


def noop_job() -> None:
    """The baseline of the throughput benchmark: a job that does nothing."""
