"""Reads behind the runner dashboard: handlers, circuits, tenants and recent executions.

A fixed number of queries whatever the number of handlers, and none that grows with the item table:
item counts come from the executions' counters (those created in the last 24 h, and the unfinished
ones), items running and the DLQ from partial indexes (bounded by the work in flight and the DLQ),
and Redis is read in one round trip.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Case, Count, F, IntegerField, Q, Sum, Value, When
from django.db.models.functions import Greatest
from django.utils import timezone

from crm import jobs, resilience
from crm.models import Organization
from runner.models import DEFAULT_TENANT_LIMIT, Execution, ExecutionItem, Handler, IntegrationType

RECENT = 20
ACTIVITY_WINDOW = timedelta(hours=24)


@dataclass
class HandlerRow:
    handler: Handler
    in_flight: int = 0
    rate_used: int = 0
    executions: dict[str, int] = field(default_factory=dict)  # by status, created in the last 24 h
    items: dict[str, int] = field(default_factory=dict)  # by item status
    dlq: int = 0

    @property
    def item_counts(self) -> list[int]:
        """The item counts in the order of ExecutionItem.Status (the template's columns)."""
        return [self.items.get(s, 0) for s in ExecutionItem.Status.values]

    @property
    def execution_counts(self) -> list[tuple[str, int]]:
        return [(str(label), n) for s, label in Execution.Status.choices if (n := self.executions.get(s, 0))]


@dataclass
class IntegrationRow:
    integration: IntegrationType
    breaker: resilience.BreakerView


@dataclass
class TenantRow:
    organization_id: int
    name: str
    limit: int
    used: int

    @property
    def percent(self) -> int:
        return round(100 * self.used / self.limit) if self.limit else 0


@dataclass
class Dashboard:
    handlers: list[HandlerRow]
    integrations: list[IntegrationRow]
    tenants: list[TenantRow]
    recent: list[Execution]
    since: datetime


def _executions_by_handler(
    handler_ids: list[int], since: datetime
) -> tuple[dict[int, dict[str, int]], dict[int, dict[str, int]], set[int]]:
    """Executions created since `since` by handler and status, and the final item counters of them.

    Filtered on the handlers' ids so the (handler, -created_at) index answers: the rows read are the
    last 24 h of runs, not the table."""
    executions: dict[int, dict[str, int]] = defaultdict(dict)
    items: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    organizations: set[int] = set()
    rows = (
        Execution.objects.filter(handler_id__in=handler_ids, created_at__gte=since)
        .values("handler_id", "organization_id", "status")
        .annotate(
            n=Count("id"),
            succeeded=Sum("items_succeeded"),
            failed=Sum("items_failed"),
            cancelled=Sum("items_cancelled"),
        )
        .order_by()
    )
    for r in rows:
        h = r["handler_id"]
        organizations.add(r["organization_id"])
        executions[h][r["status"]] = executions[h].get(r["status"], 0) + r["n"]
        for status in ("succeeded", "failed", "cancelled"):
            items[h][status] += r[status] or 0
    return executions, items, organizations


def _unfinished_by_handler() -> tuple[dict[int, int], set[int]]:
    """Items not yet final of every unfinished run (however old), from its fan-in counter (less the
    run's own token while it is still producing): the partial index on unfinished runs."""
    token = Case(
        When(fanned_out_at__isnull=True, then=Value(1)), default=Value(0), output_field=IntegerField()
    )
    rows = (
        Execution.objects.filter(status__in=[Execution.Status.PENDING, Execution.Status.RUNNING])
        .values("handler_id", "organization_id")
        .annotate(open=Sum(Greatest(F("items_remaining") - token, Value(0))))
        .order_by()
    )
    unfinished: dict[int, int] = defaultdict(int)
    organizations: set[int] = set()
    for r in rows:
        unfinished[r["handler_id"]] += r["open"] or 0
        organizations.add(r["organization_id"])
    return unfinished, organizations


def _items_by_handler(condition: Q) -> dict[int, int]:
    rows = (
        ExecutionItem.objects.filter(condition)
        .values("execution__handler_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {r["execution__handler_id"]: r["n"] for r in rows}


def runner_dashboard(*, now: datetime | None = None) -> Dashboard:
    """Everything the dashboard shows, in eight queries and one Redis round trip."""
    since = (now or timezone.now()) - ACTIVITY_WINDOW
    handlers = list(Handler.objects.select_related("integration", "organization"))
    integrations = list(IntegrationType.objects.all())
    handler_ids = [h.pk for h in handlers]
    executions, finals, active_orgs = _executions_by_handler(handler_ids, since)
    unfinished, unfinished_orgs = _unfinished_by_handler()
    # Items running: bounded by the handlers' concurrency (and claims abandoned by dead workers).
    running = _items_by_handler(Q(status=ExecutionItem.Status.RUNNING))
    # The DLQ: the partial index on dlq_at (replayed items leave it, their dlq_at is cleared).
    dlq = _items_by_handler(Q(dlq_at__isnull=False))

    org_ids = active_orgs | unfinished_orgs | {h.organization_id for h in handlers if h.organization_id}
    organizations = list(
        Organization.objects.filter(pk__in=org_ids).values(
            "pk", "name", "runner_settings__rate_limit_per_minute"
        )
    )
    state = resilience.snapshot(
        jobs.get_connection(),
        integration_keys=[it.integration_key for it in integrations],
        handler_ids=handler_ids,
        organization_ids=[o["pk"] for o in organizations],
    )

    rows = []
    for h in handlers:
        in_run = running.get(h.pk, 0)
        rows.append(
            HandlerRow(
                handler=h,
                in_flight=state.in_flight.get(h.pk, 0),
                rate_used=state.handler_used.get(h.pk, 0),
                executions=dict(executions.get(h.pk, {})),
                items={
                    "pending": max(unfinished.get(h.pk, 0) - in_run, 0),
                    "running": in_run,
                    **{s: finals.get(h.pk, {}).get(s, 0) for s in ("succeeded", "failed", "cancelled")},
                },
                dlq=dlq.get(h.pk, 0),
            )
        )
    tenants = [
        TenantRow(
            organization_id=o["pk"],
            name=o["name"],
            limit=o["runner_settings__rate_limit_per_minute"] or DEFAULT_TENANT_LIMIT,
            used=state.tenant_used.get(o["pk"], 0),
        )
        for o in organizations
    ]
    tenants.sort(key=lambda t: (-t.used / t.limit, t.name))
    recent = list(
        Execution.objects.select_related("handler__integration", "organization").order_by("-id")[:RECENT]
    )
    return Dashboard(
        handlers=rows,
        integrations=[IntegrationRow(it, state.breakers[it.integration_key]) for it in integrations],
        tenants=tenants,
        recent=recent,
        since=since,
    )
