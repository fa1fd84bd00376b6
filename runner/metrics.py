"""The runner's families on /metrics (registered with crm.prometheus by RunnerConfig.ready)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from redis import Redis

from crm.resilience import snapshot
from runner.models import ExecutionItem, IntegrationType

CIRCUIT_STATES = {"closed": 0, "half": 1, "open": 2}


def collect_circuits_and_dlq(connection: Redis) -> Iterator[Metric]:
    """`crm_circuit_state` per integration and `crm_runner_dlq_items`."""
    family = GaugeMetricFamily(
        "crm_circuit_state",
        "Integration runner circuit breaker: 0 closed, 1 half-open, 2 open.",
        labels=["integration"],
    )
    keys = list(IntegrationType.objects.order_by("integration_key").values_list("integration_key", flat=True))
    # The dashboard's read (Redis's clock; an open circuit past its time reads half-open).
    breakers = snapshot(connection, integration_keys=keys, handler_ids=[], organization_ids=[]).breakers
    for key in keys:
        family.add_metric([key], CIRCUIT_STATES.get(breakers[key].state, 0))
    yield family
    # dlq_at is set with the failure and cleared by a replay: counted on its partial index.
    n = ExecutionItem.objects.filter(dlq_at__isnull=False).count()
    yield GaugeMetricFamily("crm_runner_dlq_items", "Runner items in the DLQ (not replayed).", value=n)
