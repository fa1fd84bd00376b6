"""The runner's knobs: a Django setting of the same name wins, then the environment, then the default."""

from __future__ import annotations

import os

from django.conf import settings

from crm.resilience import BreakerPolicy

DEFAULTS: dict[str, float] = {
    "RUNNER_BREAKER_FAILURES": 5,
    "RUNNER_BREAKER_OPEN_SECONDS": 30,
    "RUNNER_BREAKER_SUCCESSES": 2,
    "RUNNER_BREAKER_PROBES": 1,
    "RUNNER_RETRY_BACKOFF": 5,  # seconds before the 2nd attempt; doubles after
    "RUNNER_TENANT_DEFER": 5,  # seconds an item over its tenant's limit waits
    "RUNNER_PAUSE_DEFER": 5,  # seconds between looks at a paused handler
    "RUNNER_LEASE_SECONDS": 60,  # a concurrency slot of a dead worker is free after this
    "RUNNER_CACHE_TTL": 60,
    "RUNNER_AMQP_MAX_BYTES": 1024 * 1024,  # a larger AMQP body (also once gunzipped) is dead-lettered
}


def get(name: str) -> float:
    value = getattr(settings, name, None)
    if value is None:
        value = os.environ.get(name)
    return float(value) if value is not None else DEFAULTS[name]


def breaker_policy() -> BreakerPolicy:
    return BreakerPolicy(
        failures=int(get("RUNNER_BREAKER_FAILURES")),
        open_ms=int(get("RUNNER_BREAKER_OPEN_SECONDS") * 1000),
        successes=int(get("RUNNER_BREAKER_SUCCESSES")),
        probes=int(get("RUNNER_BREAKER_PROBES")),
        probe_lease_ms=int(get("RUNNER_LEASE_SECONDS") * 1000),
    )
