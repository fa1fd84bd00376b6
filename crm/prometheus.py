"""GET /metrics: the platform in Prometheus's text format, and the counters workers keep for it.

Workers and services run in many processes, so nothing is counted in process memory: every
worker adds each job's outcome and duration to Redis hashes (`record_job`, in the round trip it
already makes to go idle) and services add their own counts with `count`. A scrape reads those
hashes and the queues, in a few round trips whatever the number of jobs behind them, then asks each
app's collector for its own families (campaign messages, the runner's breakers and DLQ): apps
register them with `register_collector` and their counters with `register_counter` from their
AppConfig.ready, so the platform imports no app.

Access: with METRICS_TOKEN set, only `Authorization: Bearer <token>`; without it, only requests
made straight from loopback (a request relayed by a proxy on the same machine is not local).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from redis import Redis
from redis.client import Pipeline
from redis.exceptions import RedisError

from crm import jobs, queues, stats

logger = logging.getLogger(__name__)

# Hash of job outcomes and durations, fields "<queue>|outcome|<outcome>", "<queue>|le|<bucket>"
# (the jobs that fell in that bucket, not cumulative) and "<queue>|sum".
JOBS_KEY = "crm:metrics:jobs"
# Hash of the services' counters, fields "<name>|<label>=<value>[,<label>=<value>…]".
COUNTERS_KEY = "crm:metrics:counters"
BUCKETS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_BUCKET_LABELS = (*(floatToGoString(b) for b in BUCKETS), "+Inf")
# The classic text format, which every Prometheus version reads (generate_latest writes it).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OUTCOMES = ("succeeded", "failed", "retry-scheduled", "deferred")

# The services' counters: name -> (help, label names, label values always shown, even at 0).
COUNTERS: dict[str, tuple[str, tuple[str, ...], tuple[tuple[str, ...], ...]]] = {}
# An app's metric families, read at scrape time with the scrape's Redis connection.
AppCollector = Callable[[Redis], Iterable[Metric]]
_collectors: dict[str, AppCollector] = {}


def register_counter(
    name: str, doc: str, *, labels: tuple[str, ...], always: tuple[tuple[str, ...], ...] = ()
) -> None:
    """Declare a service counter `crm_<name>_total` for `count`; `always` lists the label values
    shown even before anything was counted (at 0)."""
    COUNTERS[name] = (doc, labels, always)


def register_collector(name: str, collector: AppCollector) -> None:
    """Add an app's metric families to /metrics (registering a name again replaces it). Collectors
    run in registration order after the platform's own families; a RedisError or DatabaseError
    fails the scrape (503)."""
    _collectors[name] = collector


# --- the writing side (workers and services) ---------------------------------------------------


def _bucket(seconds: float) -> str:
    for bound, label in zip(BUCKETS, _BUCKET_LABELS, strict=False):
        if seconds <= bound:
            return label
    return "+Inf"


def record_job(pipeline: Pipeline, *, queue: str, outcome: str, duration: float) -> None:
    """Queue on `pipeline` one job's outcome and duration (three hash increments, no round trip)."""
    pipeline.hincrby(JOBS_KEY, f"{queue}|outcome|{outcome}", 1)
    pipeline.hincrby(JOBS_KEY, f"{queue}|le|{_bucket(duration)}", 1)
    pipeline.hincrbyfloat(JOBS_KEY, f"{queue}|sum", round(duration, 6))


def count(name: str, n: int = 1, **labels: str) -> None:
    """Add n to a service counter shown on /metrics (one round trip; call it once per page or batch,
    not per row). A Redis failure only loses the count: it never fails the caller."""
    if name not in COUNTERS:
        raise ValueError(f"unknown counter {name!r}; register it with crm.prometheus.register_counter")
    if not n:
        return
    field = name + "|" + ",".join(f"{k}={labels[k]}" for k in sorted(labels))
    try:
        jobs.get_connection().hincrby(COUNTERS_KEY, field, n)
    except RedisError as exc:
        logger.debug("counter %s not recorded: %s", field, exc)


# --- the reading side ----------------------------------------------------------------------------


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


TENANT_SERIES = 10  # per-tenant series per fair queue; the rest are summed as "other"


class PlatformCollector(Collector):
    """Reads everything at scrape time (no state in this process)."""

    def collect(self) -> Iterator[Metric]:
        connection = jobs.get_connection()
        yield from self._queues()
        with connection.pipeline(transaction=False) as pipe:
            pipe.hgetall(JOBS_KEY)
            pipe.hgetall(COUNTERS_KEY)
            pipe.smembers("rq:workers")
            job_hash, counters, worker_keys = pipe.execute()
        yield from self._jobs({_text(k): _text(v) for k, v in job_hash.items()})
        yield from self._counters({_text(k): int(v) for k, v in counters.items()})
        yield from self._workers_and_ages(connection, sorted(_text(k) for k in worker_keys))
        for collector in _collectors.values():
            yield from collector(connection)

    @staticmethod
    def _queues() -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "crm_queue_jobs", "Jobs per queue and state (as /admin/metrics).", labels=["queue", "state"]
        )
        for queue, counts in stats.queue_stats().items():
            for state in stats.STATES:
                family.add_metric([queue, state], counts[state])
        yield family
        yield from PlatformCollector._tenants()

    @staticmethod
    def _tenants() -> Iterator[Metric]:
        """Waiting jobs per tenant of each fair queue: the TENANT_SERIES tenants holding most, the
        rest summed as organization="other" (bounded label cardinality whatever the tenants)."""
        family = GaugeMetricFamily(
            "crm_queue_tenant_waiting",
            "Jobs waiting per tenant on a fair queue (top tenants; the rest as organization=other).",
            labels=["queue", "organization"],
        )
        ready = GaugeMetricFamily(
            "crm_queue_tenants_ready", "Tenants with work waiting on a fair queue.", labels=["queue"]
        )
        for queue, summary in stats.tenant_stats(top=TENANT_SERIES).items():
            ready.add_metric([queue], summary["ready"])
            for row in summary["tenants"]:
                org = row["organization_id"]
                family.add_metric([queue, "none" if org is None else str(org)], row["waiting"])
            family.add_metric([queue, "other"], summary["other_waiting"])
        yield family
        yield ready

    @staticmethod
    def _jobs(fields: dict[str, str]) -> Iterator[Metric]:
        outcomes = CounterMetricFamily(
            "crm_jobs", "Jobs run by the workers, by queue and outcome.", labels=["queue", "outcome"]
        )
        durations = HistogramMetricFamily(
            "crm_job_duration_seconds", "Time a worker spent on a job (each run), by queue.", labels=["queue"]
        )
        seen: dict[str, dict[str, float]] = defaultdict(dict)
        buckets: dict[str, dict[str, int]] = defaultdict(dict)
        sums: dict[str, float] = {}
        for field, value in fields.items():
            queue, kind, rest = [*field.split("|", 2), "", ""][:3]
            if kind == "outcome":
                seen[queue][rest] = float(value)
            elif kind == "le":
                buckets[queue][rest] = int(value)
            elif kind == "sum":
                sums[queue] = float(value)
        names = [*queues.QUEUE_NAMES, *sorted(set(seen) - set(queues.QUEUE_NAMES))]
        for queue in names:
            for outcome in sorted(set(OUTCOMES) | set(seen[queue])):
                outcomes.add_metric([queue, outcome], seen[queue].get(outcome, 0.0))
            cumulative, points = 0, []
            for label in _BUCKET_LABELS:
                cumulative += buckets[queue].get(label, 0)
                points.append((label, float(cumulative)))
            durations.add_metric([queue], points, sum_value=sums.get(queue, 0.0))
        yield outcomes
        yield durations

    @staticmethod
    def _counters(fields: dict[str, int]) -> Iterator[Metric]:
        by_name: dict[str, dict[tuple[str, ...], int]] = defaultdict(dict)
        for field, value in fields.items():
            name, _sep, labels = field.partition("|")
            pairs = dict(pair.split("=", 1) for pair in labels.split(",") if "=" in pair)
            if name in COUNTERS:
                by_name[name][tuple(pairs.get(k, "") for k in COUNTERS[name][1])] = value
        for name, (doc, label_names, defaults) in COUNTERS.items():
            family = CounterMetricFamily(f"crm_{name}", doc, labels=list(label_names))
            values = {**dict.fromkeys(defaults, 0), **by_name[name]}
            for label_values, value in sorted(values.items()):
                family.add_metric(list(label_values), value)
            yield family

    @staticmethod
    def _workers_and_ages(connection: Redis, worker_keys: list[str]) -> Iterator[Metric]:
        # A killed worker stays in rq:workers until a sweep; its own key expires with its TTL.
        with connection.pipeline(transaction=False) as pipe:
            for key in worker_keys:
                pipe.exists(key)
            alive = pipe.execute()
        yield GaugeMetricFamily("crm_workers", "Live RQ workers.", value=sum(1 for a in alive if a))
        oldest = GaugeMetricFamily(
            "crm_oldest_waiting_seconds",
            "Age of the oldest job waiting in each queue (0 when the queue is empty).",
            labels=["queue"],
        )
        ages = {**dict.fromkeys(queues.QUEUE_NAMES, 0.0), **stats.oldest_waiting()}
        for name, age in ages.items():
            oldest.add_metric([name], round(age, 3))
        yield oldest


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(PlatformCollector())


def _is_direct_loopback(request: HttpRequest) -> bool:
    if any(h in request.META for h in ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")):
        return False
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def _authorized(request: HttpRequest, token: str) -> bool:
    scheme, _sep, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@never_cache
@require_safe
def view(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus's text format; 401/403 as the module docstring says, 503 when
    Redis or the database does not answer (Prometheus then records the scrape as failed)."""
    token = settings.METRICS_TOKEN
    if token:
        if not _authorized(request, token):
            response = HttpResponse(
                _("A valid bearer token is required."), status=401, content_type="text/plain"
            )
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    elif not _is_direct_loopback(request):
        return HttpResponse(
            _("Metrics are served to loopback only until METRICS_TOKEN is set."),
            status=403,
            content_type="text/plain",
        )
    try:
        body = generate_latest(REGISTRY)
    except (RedisError, DatabaseError) as exc:
        logger.warning("metrics scrape failed: %s", exc)
        return HttpResponse(
            _("Metrics unavailable: %(error)s") % {"error": type(exc).__name__},
            status=503,
            content_type="text/plain",
        )
    return HttpResponse(body, content_type=CONTENT_TYPE)
