"""Triggers: facts that enroll customers at once (sales, customer events), and the periodic pass
for the time-based ones (date, no_purchase) and for the steps that come due.

Event triggers run inside the transaction that recorded the fact (crm.hooks), so an enrollment
commits with its sale or its event; their first steps are enqueued after that commit, within
seconds. The periodic pass costs what is due: the due steps are a range of one partial index
(`enrollment_due`), a date trigger reads the customers born on the day (an index on the
birthday), a no-purchase trigger the sales of one day per store (`sale_store_sold_at`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from crm import hooks, jobs
from crm.models import Customer, Sale, Store
from flows import services
from flows.models import DailyPass, Enrollment, Flow

logger = logging.getLogger(__name__)

DEFAULT_AT = "09:00"
CHUNK = 5000
TIME_TRIGGERS = ("date", "no_purchase")


# --- events ------------------------------------------------------------------------------------


def _sale_matches(trigger: dict[str, Any], sale: Any) -> bool:
    if "min_total" in trigger and sale["total"] < Decimal(trigger["min_total"]):
        return False
    store = trigger.get("store")
    if store is None:
        return True
    return sale["store_id"] == store if isinstance(store, int) else sale["store__erp_code"] == store


def sales_written(event: hooks.SalesWritten) -> int:
    """The `sale` trigger and `exit_on: ["sale"]`, for sales just created (not updated); returns
    the enrollments made."""
    if not event.created_ids:
        return 0
    sales = list(
        Sale.objects.filter(pk__in=event.created_ids, customer__isnull=False).values(
            "pk", "customer_id", "total", "store_id", "store__erp_code"
        )
    )
    services.enrollments_exit(
        organization_id=event.organization_id, customer_ids=[s["customer_id"] for s in sales], event="sale"
    )
    made = 0
    for flow in Flow.objects.filter(organization_id=event.organization_id, trigger_type="sale", paused=False):
        chosen = [s for s in sales if _sale_matches(flow.trigger, s)]
        made += len(
            services.enroll(
                flow=flow,
                customer_ids=[s["customer_id"] for s in chosen],
                entry_keys=[f"sale:{s['pk']}" for s in chosen],
            )
        )
    return made


def _event_matches(trigger: dict[str, Any], event: hooks.CustomerEvent) -> bool:
    data = event.data or {}
    kind = trigger["type"]
    if kind == "whatsapp_reply" and trigger.get("keywords"):
        words = str(data.get("text", "")).casefold().split()
        return any(k.casefold() in words for k in trigger["keywords"])
    if kind == "link_clicked" and "campaign" in trigger:
        return data.get("campaign_id") == trigger["campaign"]
    if kind == "survey_answered" and "max_score" in trigger:
        score = data.get("score")
        return isinstance(score, int) and score <= trigger["max_score"]
    if kind == "segment_entered":
        return data.get("segment") == trigger.get("segment")
    return True


def customer_events(events: Sequence[hooks.CustomerEvent]) -> int:
    """Every customer-event trigger, exit_on and the `replied` mark; returns the enrollments made."""
    by_org: dict[int, list[hooks.CustomerEvent]] = defaultdict(list)
    for e in events:
        by_org[e.organization_id].append(e)
    made = 0
    for org_id, org_events in by_org.items():
        kinds = {e.kind for e in org_events}
        for kind in kinds:
            customers = [e.customer_id for e in org_events if e.kind == kind]
            services.enrollments_exit(organization_id=org_id, customer_ids=customers, event=kind)
        replies = [e for e in org_events if e.kind == "whatsapp_reply"]
        if replies:
            services.enrollments_replied(customer_ids=[e.customer_id for e in replies], at=timezone.now())
        for flow in Flow.objects.filter(organization_id=org_id, trigger_type__in=kinds, paused=False):
            chosen = [
                e for e in org_events if e.kind == flow.trigger_type and _event_matches(flow.trigger, e)
            ]
            made += len(
                services.enroll(
                    flow=flow,
                    customer_ids=[e.customer_id for e in chosen],
                    entry_keys=[f"{e.kind}:{e.key or e.at.isoformat()}"[:120] for e in chosen],
                )
            )
    return made


# --- due steps ---------------------------------------------------------------------------------


def due_specs(*, now: datetime | None = None) -> Iterator[jobs.JobSpec]:
    """A job for every batch of due enrollments (the recoverer and the tick): one range of the
    partial index on due_at, oldest first, paused flows left out; up to ADVANCE_BATCH of one
    organization per job, named after its lowest enrollment and that one's step (the batch
    `enroll` enqueued for the same enrollments has the same name: not enqueued twice)."""
    due = (
        Enrollment.objects.filter(
            status=Enrollment.Status.ACTIVE, due_at__lte=now or timezone.now(), flow__paused=False
        )
        .order_by("due_at", "pk")
        .values_list("pk", "organization_id", "step_index")
    )
    batches: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for enrollment_id, organization_id, step in due.iterator(chunk_size=CHUNK):
        batch = batches[organization_id]
        batch.append((enrollment_id, step))
        if len(batch) == services.ADVANCE_BATCH:
            yield _batch_spec(organization_id, batches.pop(organization_id))
    for organization_id, batch in batches.items():
        yield _batch_spec(organization_id, batch)


def _batch_spec(organization_id: int, batch: list[tuple[int, int]]) -> jobs.JobSpec:
    _, step = min(batch)
    return services.advance_spec(
        enrollment_ids=[e for e, _ in batch], step=step, organization_id=organization_id
    )


# --- time-based triggers -------------------------------------------------------------------------


def _birthday_ids(flow: Flow, day: date, after: int, limit: int, since: datetime | None = None) -> list[int]:
    """Customers of the flow's organization whose birthday is `day` (Feb 29 on Feb 28 of a common year)."""
    target = day - timedelta(days=int(flow.trigger.get("offset_days", 0)))
    days = [target.day]
    if target.month == 2 and target.day == 28 and not _leap(target.year):
        days.append(29)
    sql = (
        f"SELECT id FROM {Customer._meta.db_table} WHERE organization_id = %s "  # noqa: S608
        "AND birth_date IS NOT NULL AND EXTRACT(MONTH FROM birth_date) = %s "
        "AND EXTRACT(DAY FROM birth_date) = ANY(%s) AND id > %s AND updated_at >= %s ORDER BY id LIMIT %s"
    )
    floor = since or datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC"))
    with connection.cursor() as cursor:
        cursor.execute(sql, [flow.organization_id, target.month, days, after, floor, limit])
        return [row[0] for row in cursor.fetchall()]


def _leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _lapsed(flow: Flow, day: date, tz: ZoneInfo) -> list[tuple[int, int]]:
    """(customer, last sale) of the customers whose last sale was `days` local days before `day`
    (or the day before that: a pass missed yesterday is caught up; the sale is the entry key)."""
    lapse = day - timedelta(days=int(flow.trigger["days"]))
    start = datetime.combine(lapse - timedelta(days=1), time(0), tzinfo=tz)
    end = datetime.combine(lapse + timedelta(days=1), time(0), tzinfo=tz)
    stores = list(Store.objects.filter(organization_id=flow.organization_id).values_list("pk", flat=True))
    table = Sale._meta.db_table
    sql = (
        f"SELECT DISTINCT ON (s.customer_id) s.customer_id, s.id FROM {table} s "  # noqa: S608
        "WHERE s.store_id = ANY(%s) AND s.sold_at >= %s AND s.sold_at < %s AND s.customer_id IS NOT NULL "
        f"AND NOT EXISTS (SELECT 1 FROM {table} later WHERE later.customer_id = s.customer_id "
        "AND later.sold_at > s.sold_at) ORDER BY s.customer_id, s.sold_at DESC, s.id DESC"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [stores, start, end])
        return [(row[0], row[1]) for row in cursor.fetchall()]


def who_enters(*, flow: Flow, day: date, since: datetime | None = None) -> Iterator[tuple[int, str]]:
    """(customer id, entry key) of everyone a date or no_purchase trigger enters on local `day`
    (before the reentry rule): the pass's and the dry-run's list. `since`: only the customers
    changed since then (a date trigger's catch-up: a birthday set today)."""
    if flow.trigger_type == "no_purchase":
        for customer_id, sale_id in _lapsed(flow, day, ZoneInfo(flow.organization.timezone)):
            yield customer_id, f"lapse:{sale_id}"
        return
    after = 0
    while True:
        ids = _birthday_ids(flow, day, after, CHUNK, since)
        for customer_id in ids:
            yield customer_id, f"date:{day.isoformat()}"
        if len(ids) < CHUNK:
            return
        after = ids[-1]


def _due_today(flow: Flow, now: datetime) -> date | None:
    """The flow's local day when its pass is due now (its `at` has passed), else None."""
    local = now.astimezone(ZoneInfo(flow.organization.timezone))
    hour, minute = (int(p) for p in flow.trigger.get("at", DEFAULT_AT).split(":"))
    return local.date() if local.time() >= time(hour, minute) else None


def daily_pass(*, flow: Flow, now: datetime | None = None) -> int | None:
    """Enter today's customers of a date or no_purchase flow, once per local day (a DailyPass row,
    unique, committed with the enrollments: a second run the same day, or a run after the
    scheduler was down that morning, does the day exactly once). Later runs that day of a date
    trigger catch up only the customers changed since the last run (a birth date set to today),
    the entry key (the day) keeping each customer's entry single. None when not due or done."""
    now = now or timezone.now()
    day = _due_today(flow, now)
    if day is None:
        return None
    done = DailyPass.objects.filter(flow=flow, day=day).first()
    if done is not None:
        return _catch_up(flow, done, now) if flow.trigger_type == "date" else None
    try:
        with transaction.atomic():
            marker = DailyPass.objects.create(flow=flow, day=day, at=now)
            entered = _enter_all(flow, who_enters(flow=flow, day=day))
            DailyPass.objects.filter(pk=marker.pk).update(entered=entered)
    except IntegrityError:
        return None  # a concurrent pass did the day
    return entered


def _catch_up(flow: Flow, done: DailyPass, now: datetime) -> int | None:
    with transaction.atomic():
        # Customers saved since a minute before the last run: a save committed late is not missed.
        entered = _enter_all(flow, who_enters(flow=flow, day=done.day, since=done.at - timedelta(minutes=1)))
        DailyPass.objects.filter(pk=done.pk).update(at=now, entered=F("entered") + entered)
    return entered or None


def _enter_all(flow: Flow, rows: Iterator[tuple[int, str]]) -> int:
    entered = 0
    batch: list[tuple[int, str]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == CHUNK:
            entered += _enroll_batch(flow, batch)
            batch = []
    return entered + _enroll_batch(flow, batch)


def _enroll_batch(flow: Flow, batch: list[tuple[int, str]]) -> int:
    if not batch:
        return 0
    return len(
        services.enroll(flow=flow, customer_ids=[c for c, _ in batch], entry_keys=[k for _, k in batch])
    )


def daily_passes(*, now: datetime | None = None) -> int:
    """Every time-based flow's pass that is due; returns the customers entered."""
    flows = Flow.objects.filter(trigger_type__in=TIME_TRIGGERS, paused=False).select_related("organization")
    return sum(daily_pass(flow=flow, now=now) or 0 for flow in flows)


def dry_run(*, flow: Flow, day: date | None = None, limit: int = 50) -> tuple[int, list[int]]:
    """Who a date or no_purchase flow would enter on local `day` (default today): (how many, the
    first `limit` customer ids). Writes nothing."""
    if flow.trigger_type not in TIME_TRIGGERS:
        return 0, []
    day = day or timezone.now().astimezone(ZoneInfo(flow.organization.timezone)).date()
    total, first = 0, list[int]()
    for customer_id, _ in who_enters(flow=flow, day=day):
        total += 1
        if len(first) < limit:
            first.append(customer_id)
    return total, first
