"""ERP syncs: customers (daily full, incremental) and each store's sales, streamed page by page.

A sync never holds more than one page: each page is upserted in bulk (``INSERT … SELECT * FROM
unnest(…) ON CONFLICT``) in one transaction that also moves the sync's position, so a crash
loses at most the page in flight and a second run picks up exactly where the first stopped.
Upserts are keyed on the ERP ids and guarded by the ERP's trans_id (an older copy never
overwrites a newer one, an identical one writes nothing), so running a window twice leaves the
same database. Records the client cannot read are skipped and kept as ErpSyncIssues.

Job ids (see erp/schedules.py): ``erp-sales-<org>-<store>-<YYYYMMDD>`` (nightly, the day synced),
``erp-sales-<org>-<store>-<YYYYMMDDHH>`` (hourly, the hour synced; both in the organization's
time zone) and ``erp-customers-<org>-<YYYYMMDD>`` (the daily full sync). Each is also the key of
the JobRun checkpoint written before the job exists, so `recover` re-enqueues one Redis lost.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as day_time
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import pgettext

from crm import hooks, jobs, prometheus, queues
from crm.cli import number
from crm.models import JobRun, Organization, Store
from erp.models import ErpConnection
from erp.reasons import SALE_OF_ANOTHER_STORE, SOLD_IN_THE_FUTURE
from erp.upserts import SalesUpsert, customers_upsert, sales_upsert, sync_issues_record
from integrations.millennium.client import (
    CUSTOMERS_PATH,
    ErpCustomer,
    ErpSale,
    MalformedRecord,
    MillenniumClient,
    Page,
)

logger = logging.getLogger(__name__)

NIGHTLY = "nightly"
HOURLY = "hourly"
MANUAL = "manual"
FREQUENCIES = (NIGHTLY, HOURLY, MANUAL)
# The seed's staggering: store i of an organization starts i * 2 min + 0-30 s after the fan-out,
# so a hundred stores never hit the ERP at once.
STAGGER_STEP = 120
STAGGER_JITTER = 30
SALES_TASK = "erp.tasks.erp_sales_sync"
CUSTOMERS_TASK = "erp.tasks.erp_customers_sync"


# --- results -------------------------------------------------------------------------------------


@dataclass
class SyncResult:
    """What a sync did; `summary()` is the operator's one line."""

    kind: str  # "customers" | "sales"
    what: str  # what the summary line names: "customers (full)", "sales 001"
    read: int = 0
    upserted: int = 0
    created: int = 0
    changed: int = 0
    skipped: int = 0
    pages: int = 0
    customers_created: int = 0  # placeholders for customers that synced sales refer to
    surveys: int = 0
    attributed: int = 0  # sales credited to a campaign (campaigns.attribution)
    future: int = 0  # sales refused: stamped more than SALE_FUTURE_TOLERANCE_SECONDS ahead
    started_trans_id: int = 0
    trans_id: int = 0  # customers: the high-water mark after the sync
    resumed: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        values = {
            "what": self.what,
            "read": number(self.read),
            "upserted": number(self.upserted),
            "created": number(self.created),
            "changed": number(self.changed),
            "skipped": number(self.skipped),
            "seconds": number(self.seconds, 1),
            "customers": number(self.customers_created),
            "surveys": number(self.surveys),
            "attributed": number(self.attributed),
            "future": number(self.future),
            "trans_id": self.trans_id,
            "from": self.started_trans_id,
        }
        line = (
            _(
                "%(what)s: %(read)s read, %(upserted)s upserted (%(created)s new, %(changed)s changed), "
                "%(skipped)s skipped (malformed) in %(seconds)ss"
            )
            % values
        )
        if self.kind == "customers":
            if self.resumed:
                line += _(" — resumed from trans_id %(from)s") % values
            line += _(" — high-water trans_id %(trans_id)s") % values
        else:
            line += _(" — %(customers)s customers created, %(surveys)s surveys scheduled") % values
            line += _(", %(attributed)s attributed to campaigns") % values
            if self.future:
                line += _(", %(future)s refused (sold in the future)") % values
        return line


# --- syncs ---------------------------------------------------------------------------------------


def erp_client(connection: ErpConnection) -> MillenniumClient:
    """A client for the connection, its password decrypted in memory only."""
    return MillenniumClient(
        base_url=connection.base_url,
        username=connection.username,
        password=connection.get_password(),
        timeout=float(connection.timeout_seconds),
    )


def organization_zone(organization: Organization) -> ZoneInfo:
    return ZoneInfo(organization.timezone)


def _error_clear(connection: ErpConnection, *, since: datetime) -> None:
    ErpConnection.objects.filter(pk=connection.pk, last_error_at__lt=since).update(
        last_error="", last_error_at=None
    )


def connection_error_record(*, organization_id: int, error: str) -> None:
    """Show the last failure on the connection's admin page."""
    ErpConnection.objects.filter(organization_id=organization_id).update(
        last_error=error[:2000], last_error_at=timezone.now()
    )


def customers_sync(
    *,
    connection: ErpConnection,
    full: bool,
    day: date | None = None,
    progress: Callable[[SyncResult], None] | None = None,
) -> SyncResult:
    """Stream the ERP's customers into the database a page at a time; returns the counts.

    Full (the daily one, for `day` in the organization's zone): from trans_id 0, or, when a full
    sync of that day was interrupted, from where it stopped. Incremental: from the high-water
    mark. Each page's upsert and the positions it reaches commit together, so a crash loses at
    most the page in flight. Safe to run twice and concurrently."""
    began, started = timezone.now(), time.monotonic()
    org_id = connection.organization_id
    rows = ErpConnection.objects.filter(pk=connection.pk)
    connection.refresh_from_db()
    result = SyncResult(
        kind="customers",
        what=pgettext("erp sync", "customers (full)") if full else pgettext("erp sync", "customers"),
    )
    if full:
        day = day or timezone.localdate(timezone=organization_zone(connection.organization))
        full_start = _customers_full_start(connection, rows, day, result)
        if full_start is None:
            return result
        start = full_start
    else:
        start = connection.customers_trans_id
    result.started_trans_id = result.trans_id = start
    with erp_client(connection) as client:
        for page in client.customer_pages(trans_id=start, top=connection.page_size):
            _customers_page_store(org_id, rows, page, full=full, result=result)
            if progress:
                progress(result)
    now = timezone.now()
    if full:
        rows.filter(customers_full_day=day).update(
            customers_full_cursor=None, customers_full_synced_at=now, customers_synced_at=now
        )
    else:
        rows.update(customers_synced_at=now)
    _error_clear(connection, since=began)
    result.trans_id = rows.values_list("customers_trans_id", flat=True).get()
    result.seconds = time.monotonic() - started
    logger.info("ERP sync: %s", result.summary(), extra={"organization_id": org_id})
    return result


def _customers_full_start(
    connection: ErpConnection, rows: models.QuerySet[ErpConnection], day: date, result: SyncResult
) -> int | None:
    """Where the full customer sync of `day` starts: where that day's interrupted one stopped, else
    0 (that day's run takes the cursor over). None when a newer day's full sync supersedes it."""
    if connection.customers_full_day and day < connection.customers_full_day:
        # A late retry of an older day's run: the newer full sync makes it pointless, and
        # taking the cursor over would restart that one from 0.
        logger.info(
            "ERP full customer sync of %s skipped: superseded by the one of %s",
            day,
            connection.customers_full_day,
            extra={"organization_id": connection.organization_id},
        )
        return None
    if connection.customers_full_day == day and connection.customers_full_cursor is not None:
        result.resumed = connection.customers_full_cursor > 0
        return connection.customers_full_cursor
    rows.update(customers_full_day=day, customers_full_cursor=0)
    return 0


def _customers_page_store(
    org_id: int,
    rows: models.QuerySet[ErpConnection],
    page: Page[ErpCustomer],
    *,
    full: bool,
    result: SyncResult,
) -> None:
    """Upsert one page of customers and move the connection's positions past it, in one
    transaction; add its counts to `result`."""
    moves: dict[str, Any] = {
        "customers_trans_id": Greatest(F("customers_trans_id"), Value(page.next_trans_id))
    }
    if full:
        moves["customers_full_cursor"] = Greatest(
            Coalesce(F("customers_full_cursor"), Value(0)), Value(page.next_trans_id)
        )
    with transaction.atomic():
        created, changed = customers_upsert(organization_id=org_id, customers=page.records)
        sync_issues_record(organization_id=org_id, issues=page.malformed)
        rows.update(**moves)
    prometheus.count("erp_sync_rows", len(page.records), kind="customers")
    result.pages += 1
    result.read += page.size
    result.upserted += len(page.records)
    result.created += created
    result.changed += changed
    result.skipped += len(page.malformed)
    result.trans_id = max(result.trans_id, page.next_trans_id)


def _sales_refuse(page: Page[ErpSale], *, store: Store) -> tuple[list[ErpSale], list[MalformedRecord], int]:
    """A page's sales split into (those to store, the issues to record, how many of them are from the
    future). Refused: a sale of another store, and one stamped more than SALE_FUTURE_TOLERANCE_SECONDS
    ahead of now (a wrong clock in the ERP: stored, it would be credited to campaigns before it
    happened; the sync of its hour reads it again once its time has come)."""
    limit = timezone.now() + timedelta(seconds=settings.SALE_FUTURE_TOLERANCE_SECONDS)
    ours: list[ErpSale] = []
    issues = list(page.malformed)
    future = 0
    for s in page.records:
        if s.store_code != store.erp_code:
            code, params = SALE_OF_ANOTHER_STORE, {"store": repr(s.store_code), "asked": repr(store.erp_code)}
        elif s.sold_at > limit:
            code, params = SOLD_IN_THE_FUTURE, {"sold_at": s.sold_at.isoformat()}
            future += 1
        else:
            ours.append(s)
            continue
        issues.append(
            MalformedRecord(
                kind="sale",
                external_id=s.erp_id,
                trans_id=s.trans_id,
                reason=code % params,
                excerpt="",
                reason_code=code,
                reason_params=params,
            )
        )
    return ours, issues, future


def sales_page_store(
    *, store: Store, sales: Sequence[ErpSale], malformed: Sequence[MalformedRecord] = ()
) -> tuple[SalesUpsert, dict[str, int]]:
    """One page of a store's sales written as the ERP sync writes it, in one transaction: the
    sales (and placeholder customers), the page's issues, and the "sales written" hook (surveys,
    attribution, lift, the flows' `sale` trigger). Returns the upsert's counts and the hook's."""
    with transaction.atomic():
        outcome = sales_upsert(store=store, sales=sales)
        sync_issues_record(organization_id=store.organization_id, store_id=store.pk, issues=malformed)
        told = hooks.sales_written(
            organization_id=store.organization_id, sale_ids=outcome.sale_ids, created_ids=outcome.new_sale_ids
        )
    return outcome, told


def sales_sync(
    *,
    store: Store,
    start: datetime,
    end: datetime,
    connection: ErpConnection | None = None,
    progress: Callable[[SyncResult], None] | None = None,
) -> SyncResult:
    """Upsert one store's sales issued in [start, end) (and placeholders for the customers they
    name); schedules the post-sale survey of every new sale. Returns the counts.

    Each page (sales, placeholders, surveys, issues) commits as one; running the same window
    twice leaves the same database."""
    began, started = timezone.now(), time.monotonic()
    if connection is None:
        connection = ErpConnection.objects.get(organization_id=store.organization_id)
    org_id = store.organization_id
    result = SyncResult(
        kind="sales", what=pgettext("erp sync", "sales %(store)s") % {"store": store.erp_code}
    )
    with erp_client(connection) as client:
        for page in client.sale_pages(
            store_code=store.erp_code, start=start, end=end, top=connection.page_size
        ):
            ours, malformed, future = _sales_refuse(page, store=store)
            outcome, told = sales_page_store(store=store, sales=ours, malformed=malformed)
            prometheus.count("erp_sync_rows", len(ours), kind="sales")
            result.pages += 1
            result.read += page.size
            result.upserted += len(ours)
            result.created += outcome.created
            result.changed += outcome.changed
            result.customers_created += outcome.customers_created
            result.surveys += told.get("surveys", 0)
            result.attributed += told.get("attributed", 0)
            result.skipped += len(malformed) - future
            result.future += future
            result.trans_id = max(result.trans_id, page.next_trans_id)
            if progress:
                progress(result)
    ErpConnection.objects.filter(pk=connection.pk).update(sales_synced_at=timezone.now())
    _error_clear(connection, since=began)
    result.seconds = time.monotonic() - started
    logger.info(
        "ERP sync: %s %s to %s: %s",
        store.erp_code,
        start,
        end,
        result.summary(),
        extra={"organization_id": org_id},
    )
    return result


def erp_connection_check(*, connection: ErpConnection) -> int:
    """Ask the ERP for one customer (a login and reachability check); returns how many came (0 or 1).
    Raises IntegrationError when the ERP refuses or cannot be reached."""
    with erp_client(connection) as client:
        return len(client.list_values(CUSTOMERS_PATH, {"trans_id": "0"}, top=1))


# --- windows, job ids and the fan-out ------------------------------------------------------------


def sales_window(*, frequency: str, at: datetime, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """The window a sync fired at `at` covers, in the organization's zone: nightly = yesterday
    (00:00 to 00:00), hourly = the last whole hour."""
    local = at.astimezone(zone)
    if frequency == NIGHTLY:
        today = local.date()
        return (
            datetime.combine(today - timedelta(days=1), day_time(0), tzinfo=zone),
            datetime.combine(today, day_time(0), tzinfo=zone),
        )
    if frequency == HOURLY:
        end = local.replace(minute=0, second=0, microsecond=0)
        return (end.astimezone(UTC) - timedelta(hours=1)).astimezone(zone), end
    raise ValueError(f"unknown frequency {frequency!r}; expected {NIGHTLY} or {HOURLY}")


def sales_job_id(
    *, organization_id: int, store_id: int, frequency: str, start: datetime, end: datetime
) -> str:
    """``erp-sales-<org>-<store>-<YYYYMMDD>`` (nightly) or ``-<YYYYMMDDHH>`` (hourly), from the
    window's start in its own zone; any other window gets both ends to the minute."""
    if frequency == NIGHTLY:
        stamp = f"{start:%Y%m%d}"
    elif frequency == HOURLY:
        stamp = f"{start:%Y%m%d%H}"
    else:
        stamp = f"{start:%Y%m%d%H%M}-{end:%Y%m%d%H%M}"
    return jobs.make_job_id("erp-sales", organization_id, store_id, stamp)


def customers_job_id(*, organization_id: int, day: date) -> str:
    """``erp-customers-<org>-<YYYYMMDD>``: one full sync per organization and day."""
    return jobs.make_job_id("erp-customers", organization_id, f"{day:%Y%m%d}")


def _durable_enqueue(
    *,
    kind: str,
    job_id: str,
    func: str,
    queue: str,
    kwargs: dict[str, Any],
    organization_id: int,
    delay: float | None = None,
    description: str = "",
) -> bool:
    """Record the run (JobRun, key = job id) before its job exists, then enqueue it with its
    fixed id; False when that run already completed. A job id still in Redis (queued, delayed,
    running, or finished less than the queue's result_ttl — 25 h — ago) is refused by RQ."""
    run, _created = JobRun.objects.get_or_create(
        kind=kind,
        key=job_id,
        defaults={
            "func": func,
            "queue": queue,
            "kwargs": kwargs,
            "job_id": job_id,
            "organization_id": organization_id,
        },
    )
    if run.status == JobRun.Status.COMPLETED:
        return False
    jobs.enqueue(
        func,
        queue=queue,
        kwargs=kwargs,
        job_id=job_id,
        unique=True,
        delay=delay,
        description=description or job_id,
    )
    return True


def _sales_enqueue(
    *, store: Store, start: datetime, end: datetime, frequency: str, delay: float | None
) -> tuple[str, bool]:
    if frequency not in FREQUENCIES:
        raise ValueError(f"unknown frequency {frequency!r}; expected one of {', '.join(FREQUENCIES)}")
    job_id = sales_job_id(
        organization_id=store.organization_id, store_id=store.pk, frequency=frequency, start=start, end=end
    )
    enqueued = _durable_enqueue(
        kind="erp-sales",
        job_id=job_id,
        func=SALES_TASK,
        queue=queues.ERP_SYNC,
        kwargs={
            "organization_id": store.organization_id,
            "store_id": store.pk,
            "start": start.isoformat(),
            "end": end.isoformat(),
            "frequency": frequency,
        },
        organization_id=store.organization_id,
        delay=delay,
        description=f"ERP sales {frequency} store {store.erp_code} {start:%Y-%m-%d %H:%M}",
    )
    return job_id, enqueued


def sales_sync_enqueue(
    *, store: Store, start: datetime, end: datetime, frequency: str = MANUAL, delay: float | None = None
) -> str:
    """Enqueue one store's sales sync for [start, end) (durably, with its fixed id); returns the id."""
    return _sales_enqueue(store=store, start=start, end=end, frequency=frequency, delay=delay)[0]


def sales_sync_today(*, connection: ErpConnection, now: datetime | None = None) -> list[str]:
    """Enqueue a manual sales sync of today so far (the organization's day) for each of its stores;
    returns the jobs' ids. The sync's own rules apply (a sale from the future is refused)."""
    now = now or timezone.now()
    zone = organization_zone(connection.organization)
    start = now.astimezone(zone).replace(hour=0, minute=0, second=0, microsecond=0)
    stores = Store.objects.filter(organization_id=connection.organization_id).order_by("erp_code", "pk")
    return [sales_sync_enqueue(store=store, start=start, end=now, frequency=MANUAL) for store in stores]


def sales_sync_fanout(*, frequency: str, at: datetime | None = None) -> int:
    """One sales sync per store of every enabled connection, for the window the `at` firing
    covers; store i of an organization starts i * 2 min + 0-30 s later. Returns how many jobs were
    enqueued. Safe to run twice: the ids are per store and day (nightly) or hour (hourly)."""
    at = at or timezone.now()
    count = 0
    for connection in ErpConnection.objects.filter(enabled=True).select_related("organization"):
        start, end = sales_window(frequency=frequency, at=at, zone=organization_zone(connection.organization))
        stores = Store.objects.filter(organization_id=connection.organization_id).order_by("erp_code", "pk")
        for i, store in enumerate(stores):
            delay = i * STAGGER_STEP + random.uniform(0, STAGGER_JITTER)
            count += _sales_enqueue(store=store, start=start, end=end, frequency=frequency, delay=delay)[1]
    return count


def _customers_enqueue(*, connection: ErpConnection, day: date) -> tuple[str, bool]:
    job_id = customers_job_id(organization_id=connection.organization_id, day=day)
    enqueued = _durable_enqueue(
        kind="erp-customers",
        job_id=job_id,
        func=CUSTOMERS_TASK,
        queue=queues.ERP_CUSTOMER_SYNC,
        kwargs={"organization_id": connection.organization_id, "full": True, "day": day.isoformat()},
        organization_id=connection.organization_id,
        description=f"ERP customers full sync {day:%Y-%m-%d}",
    )
    return job_id, enqueued


def customers_sync_enqueue(*, connection: ErpConnection, day: date | None = None) -> str:
    """Enqueue the organization's full customer sync of `day` (its own zone; default today) with its
    fixed id; returns the id. At most one per organization and day."""
    day = day or timezone.localdate(timezone=organization_zone(connection.organization))
    return _customers_enqueue(connection=connection, day=day)[0]


def customers_sync_fanout(*, at: datetime | None = None) -> int:
    """The daily full customer sync of every enabled connection; returns how many were enqueued."""
    at = at or timezone.now()
    count = 0
    for connection in ErpConnection.objects.filter(enabled=True).select_related("organization"):
        day = at.astimezone(organization_zone(connection.organization)).date()
        count += _customers_enqueue(connection=connection, day=day)[1]
    return count
