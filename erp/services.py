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

import hashlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as day_time
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection as db
from django.db import models, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import pgettext

from crm import hooks, jobs, prometheus, queues
from crm import services as crm_services
from crm.cli import number
from crm.models import ConsentSource, Customer, JobRun, Organization, Sale, Store
from erp.models import ErpConnection, ErpSyncIssue
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
UPSERT_CHUNK = 5000  # rows per INSERT … SELECT * FROM unnest(…)


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


# --- bulk upserts --------------------------------------------------------------------------------


def _upsert(
    model: type[models.Model],
    objs: Sequence[models.Model],
    *,
    conflict: Sequence[str],
    update: Sequence[str] = (),
    assign: Mapping[str, str] | None = None,
    where: str = "",
) -> int:
    """``INSERT … ON CONFLICT (conflict) DO UPDATE SET … [WHERE …]`` (DO NOTHING with nothing to
    update) for model instances, in chunks; returns the rows inserted or updated.

    Django's bulk_create(update_conflicts=True) has no WHERE; this one has. In `assign` and
    `where`, ``{t}`` is the table (the row already there) and EXCLUDED the row proposed."""
    if not objs:
        return 0
    meta = model._meta
    quote = db.ops.quote_name
    table = quote(meta.db_table)
    fields = [f for f in meta.local_concrete_fields if not f.primary_key]

    def column(name: str) -> str:
        field = meta.get_field(name)
        assert isinstance(field, models.Field)
        return quote(field.column)

    sets = [f"{column(n)} = EXCLUDED.{column(n)}" for n in update]
    sets += [f"{column(n)} = {expression.format(t=table)}" for n, expression in (assign or {}).items()]
    if sets:
        action = "DO UPDATE SET " + ", ".join(sets) + (f" WHERE {where.format(t=table)}" if where else "")
    else:
        action = "DO NOTHING"
    columns = ", ".join(quote(f.column) for f in fields)
    target = ", ".join(column(n) for n in conflict)
    # One array per column: the statement is the same whatever the row count, so neither the
    # driver nor the server parses thousands of placeholders (3-4x faster than VALUES here).
    arrays = ", ".join(f"%s::{f.db_type(db)}[]" for f in fields)
    # Identifiers and types come from the model's metadata; every value is a parameter.
    sql = (
        f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({arrays}) "  # noqa: S608
        f"ON CONFLICT ({target}) {action}"
    )
    written = 0
    for start in range(0, len(objs), UPSERT_CHUNK):
        part = objs[start : start + UPSERT_CHUNK]
        params = [[f.get_db_prep_save(f.pre_save(obj, add=True), db) for obj in part] for f in fields]
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            written += max(cursor.rowcount, 0)
    return written


def _upsert_columns(
    model: type[models.Model],
    values: Mapping[str, Sequence[Any]],
    *,
    conflict: Sequence[str],
    update: Sequence[str],
    where: str,
    constants: Mapping[str, Any],
) -> tuple[int, int]:
    """The same upsert as `_upsert`, from ready column lists instead of model
    instances, returning (written, created). Every other column takes its model default, prepared
    once per call; `xmax = 0` tells inserted rows from updated ones, so no SELECT is needed first."""
    meta = model._meta
    quote = db.ops.quote_name
    table = quote(meta.db_table)
    fields = [f for f in meta.local_concrete_fields if not f.primary_key]
    count = len(next(iter(values.values())))
    template = model(**constants)
    arrays: list[list[Any]] = []
    for f in fields:
        if f.attname in values:
            arrays.append(list(values[f.attname]))
        else:
            arrays.append([f.get_db_prep_save(f.pre_save(template, add=True), db)] * count)

    def column(name: str) -> str:
        field = meta.get_field(name)
        assert isinstance(field, models.Field)
        return quote(field.column)

    sets = ", ".join(f"{column(n)} = EXCLUDED.{column(n)}" for n in update)
    placeholders = ", ".join(f"%s::{f.db_type(db)}[]" for f in fields)
    # Identifiers and types come from the model's metadata; every value is a parameter.
    sql = (
        f"INSERT INTO {table} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608
        f"SELECT * FROM unnest({placeholders}) "
        f"ON CONFLICT ({', '.join(column(n) for n in conflict)}) DO UPDATE SET {sets} "
        f"WHERE {where.format(t=table)} RETURNING (xmax = 0)"
    )
    with db.cursor() as cursor:
        cursor.execute(sql, arrays)
        inserted = [row[0] for row in cursor.fetchall()]
    return len(inserted), sum(1 for new in inserted if new)


def _latest(records: Iterable[Any]) -> dict[str, Any]:
    """By ERP id, the copy with the largest trans_id (a page could carry one twice)."""
    latest: dict[str, Any] = {}
    for record in records:
        seen = latest.get(record.erp_id)
        if seen is None or record.trans_id >= seen.trans_id:
            latest[record.erp_id] = record
    return latest


# Written when the ERP's copy is newer, or the same version with different values: re-running
# a page writes nothing (updated_at stays), and a late page can never undo a newer one.
_CUSTOMER_NEWER = (
    "{t}.erp_trans_id IS NULL OR {t}.erp_trans_id < EXCLUDED.erp_trans_id OR "
    "({t}.erp_trans_id = EXCLUDED.erp_trans_id AND ({t}.name <> EXCLUDED.name OR "
    "{t}.email <> EXCLUDED.email OR {t}.phone <> EXCLUDED.phone OR {t}.cpf_cnpj <> EXCLUDED.cpf_cnpj))"
)
_SALE_NEWER = (
    "{t}.erp_trans_id IS NULL OR {t}.erp_trans_id < EXCLUDED.erp_trans_id OR "
    "({t}.erp_trans_id = EXCLUDED.erp_trans_id AND ({t}.total <> EXCLUDED.total OR "
    "{t}.sold_at <> EXCLUDED.sold_at OR {t}.store_id <> EXCLUDED.store_id OR "
    "COALESCE({t}.customer_id, 0) <> COALESCE(EXCLUDED.customer_id, 0) OR {t}.items <> EXCLUDED.items))"
)


def customers_upsert(*, organization_id: int, customers: Sequence[ErpCustomer]) -> tuple[int, int]:
    """Insert or update customers by ERP id; returns (new, changed). A new customer has no consent;
    the ERP's opt-in field, where a record carries it, gives or withdraws consent (`_consent_apply`).
    Opt-outs are never touched. Safe to run twice: an unchanged record writes nothing."""
    latest = _latest(customers)
    if not latest:
        return 0, 0
    erp_ids = sorted(latest)  # one lock order for every writer: no deadlocks between syncs
    update = ["name", "email", "phone", "cpf_cnpj", "erp_trans_id", "erp_registered_at", "updated_at"]
    # Straight from the records to column arrays: no model instance or per-field preparation
    # per row, and no "which exist already" SELECT (whose plan degrades on a large new
    # organization before its statistics are gathered) — RETURNING says which rows were new.
    now = timezone.now()
    written = created = 0
    for start in range(0, len(erp_ids), UPSERT_CHUNK):
        ids = erp_ids[start : start + UPSERT_CHUNK]
        records = [latest[erp_id] for erp_id in ids]
        chunk_written, chunk_created = _upsert_columns(
            Customer,
            {
                "erp_id": ids,
                "name": [r.name for r in records],
                "email": [r.email for r in records],
                "phone": [r.phone for r in records],
                "cpf_cnpj": [r.cpf_cnpj for r in records],
                "erp_trans_id": [r.trans_id for r in records],
                "erp_registered_at": [r.registered_at for r in records],
                "created_at": [now] * len(records),
                "updated_at": [now] * len(records),
            },
            conflict=["organization", "erp_id"],
            update=update,
            where=_CUSTOMER_NEWER,
            constants={"organization_id": organization_id},
        )
        written += chunk_written
        created += chunk_created
        _consent_apply(organization_id=organization_id, records=records)
    return created, written - created


def _consent_apply(*, organization_id: int, records: Sequence[ErpCustomer]) -> None:
    """The ERP's opt-in, recorded with source "erp": a yes gives consent to a customer without one; a
    no withdraws only a consent the ERP gave or a legacy one (a form's or the admin's stays). A record
    older than the customer's stored copy says nothing. Two bulk statements per page at most."""
    flagged = {r.erp_id: r for r in records if r.marketing_opt_in is not None}
    if not flagged:
        return
    rows: list[tuple[int, str | None, int | None]] = list(
        Customer.objects.filter(organization_id=organization_id, erp_id__in=list(flagged)).values_list(
            "pk", "erp_id", "erp_trans_id"
        )
    )
    current = [
        (pk, flagged[erp_id])
        for pk, erp_id, trans_id in rows
        if erp_id is not None and (trans_id or 0) <= flagged[erp_id].trans_id
    ]
    grant = [pk for pk, record in current if record.marketing_opt_in]
    withdraw = [pk for pk, record in current if not record.marketing_opt_in]
    if grant:
        crm_services.customers_consent_set(customer_ids=grant, given=True, source=ConsentSource.ERP)
    if withdraw:
        crm_services.customers_consent_set(
            customer_ids=withdraw,
            given=False,
            source=ConsentSource.ERP,
            # A consent held from before sources were kept (the old "consent by default") yields too.
            only_from=[ConsentSource.ERP, ConsentSource.LEGACY],
        )


@dataclass
class SalesUpsert:
    created: int = 0
    changed: int = 0
    customers_created: int = 0
    new_sale_ids: tuple[int, ...] = ()
    sale_ids: tuple[int, ...] = ()  # every sale of the page, new or not


def sales_upsert(*, store: Store, sales: Sequence[ErpSale]) -> SalesUpsert:
    """Insert or update a store's sales by ERP id, creating a placeholder customer (ERP id only,
    filled in by the next customer sync) for each one not synced yet. Safe to run twice."""
    latest = _latest(sales)
    if not latest:
        return SalesUpsert()
    org_id = store.organization_id
    referenced = sorted({s.customer_erp_id for s in latest.values() if s.customer_erp_id})
    customer_ids = dict(
        Customer.objects.filter(organization_id=org_id, erp_id__in=referenced).values_list("erp_id", "pk")
    )
    missing = [erp_id for erp_id in referenced if erp_id not in customer_ids]
    customers_created = 0
    if missing:
        customers_created = _upsert(
            Customer,
            [Customer(organization_id=org_id, erp_id=erp_id, name="") for erp_id in missing],
            conflict=["organization", "erp_id"],
        )
        customer_ids.update(
            Customer.objects.filter(organization_id=org_id, erp_id__in=missing).values_list("erp_id", "pk")
        )
    erp_ids = sorted(latest)
    existing = set(
        Sale.objects.filter(organization_id=org_id, erp_id__in=erp_ids).values_list("erp_id", flat=True)
    )
    rows = []
    for erp_id in erp_ids:
        sale = latest[erp_id]
        rows.append(
            Sale(
                organization_id=org_id,
                store_id=store.pk,
                customer_id=customer_ids.get(sale.customer_erp_id),
                erp_id=erp_id,
                total=sale.total,
                sold_at=sale.sold_at,
                items=[
                    {"product": item.product, "quantity": str(item.quantity), "price": str(item.price)}
                    for item in sale.items
                ],
                erp_trans_id=sale.trans_id,
            )
        )
    written = _upsert(
        Sale,
        rows,
        conflict=["organization", "erp_id"],
        update=["store", "customer", "total", "sold_at", "items", "erp_trans_id"],
        where=_SALE_NEWER,
    )
    new_erp_ids = [erp_id for erp_id in erp_ids if erp_id not in existing]
    ids = dict(Sale.objects.filter(organization_id=org_id, erp_id__in=erp_ids).values_list("erp_id", "pk"))
    new_ids = tuple(ids[erp_id] for erp_id in new_erp_ids if erp_id in ids)
    return SalesUpsert(
        created=len(new_erp_ids),
        changed=max(written - len(new_erp_ids), 0),
        customers_created=customers_created,
        new_sale_ids=new_ids,
        sale_ids=tuple(ids.values()),
    )


def sync_issues_record(
    *, organization_id: int, issues: Sequence[MalformedRecord], store_id: int | None = None
) -> int:
    """Keep each malformed record as an ErpSyncIssue (one per distinct problem; seeing it again
    moves `seen_at` and counts it); returns how many were recorded."""
    if not issues:
        return 0
    now = timezone.now()
    rows: dict[str, ErpSyncIssue] = {}
    for issue in issues:
        fingerprint = hashlib.sha256(
            f"{issue.kind}|{issue.external_id}|{issue.trans_id}|{issue.reason}|{issue.excerpt}".encode()
        ).hexdigest()
        rows[fingerprint] = ErpSyncIssue(
            organization_id=organization_id,
            store_id=store_id,
            kind=issue.kind,
            external_id=issue.external_id,
            trans_id=issue.trans_id,
            reason=issue.reason[:300],
            payload=issue.excerpt,
            fingerprint=fingerprint,
            first_seen_at=now,
            seen_at=now,
        )
    _upsert(
        ErpSyncIssue,
        [rows[k] for k in sorted(rows)],
        conflict=["organization", "kind", "fingerprint"],
        update=["seen_at"],
        assign={"times_seen": "{t}.times_seen + 1"},
    )
    logger.warning(
        "ERP sync: %d malformed %s record(s) skipped (organization %s)",
        len(issues),
        issues[0].kind,
        organization_id,
        extra={"organization_id": organization_id},
    )
    return len(issues)


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
            reason = f"a sale of store {s.store_code!r} answered for store {store.erp_code!r}"
        elif s.sold_at > limit:
            reason = f"sold in the future: {s.sold_at.isoformat()} is ahead of the sync's clock"
            future += 1
        else:
            ours.append(s)
            continue
        issues.append(
            MalformedRecord(kind="sale", external_id=s.erp_id, trans_id=s.trans_id, reason=reason, excerpt="")
        )
    return ours, issues, future


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
            with transaction.atomic():
                outcome = sales_upsert(store=store, sales=ours)
                sync_issues_record(organization_id=org_id, store_id=store.pk, issues=malformed)
                told = hooks.sales_written(
                    organization_id=org_id, sale_ids=outcome.sale_ids, created_ids=outcome.new_sale_ids
                )
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
