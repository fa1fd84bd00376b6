"""RQ jobs of the ERP syncs: take ids and plain values, load fresh state, run under a checkpoint.

A retryable ERP failure (timeout, network, 5xx, 429) is raised, so RQ retries the job with the
queue's policy (3 attempts, 60 s then 120 s); a non-retryable one (401/403/404, a bad answer)
fails the job at once — asking again would get the same answer — and shows on the connection.
"""

from __future__ import annotations

import logging
from datetime import date, datetime
from typing import Any

from django.utils import timezone
from rq import get_current_job

from crm import queues
from crm.checkpoints import AlreadyDone, checkpoint
from crm.models import Store
from erp import services
from erp.models import ErpConnection
from integrations.errors import IntegrationError

logger = logging.getLogger(__name__)


def _fired_at() -> datetime:
    """When this job was created (the cron firing), so a fan-out that waited in the queue still
    covers the window of its own occurrence."""
    job = get_current_job()
    return job.created_at if job is not None and job.created_at else timezone.now()


def _give_up_retries() -> None:
    job = get_current_job()
    if job is not None:
        job.retries_left = 0


def _connection(organization_id: int) -> ErpConnection | None:
    return (
        ErpConnection.objects.select_related("organization")
        .filter(organization_id=organization_id, enabled=True)
        .first()
    )


def erp_sales_fanout(*, frequency: str) -> int:
    """Cron (nightly 06:00 / hourly): enqueue every store's sales sync, staggered; returns how many."""
    return services.sales_sync_fanout(frequency=frequency, at=_fired_at())


def erp_customers_fanout() -> int:
    """Cron (daily 05:00): enqueue every organization's full customer sync; returns how many."""
    return services.customers_sync_fanout(at=_fired_at())


def erp_sales_sync(
    *, organization_id: int, store_id: int, start: str, end: str, frequency: str = services.MANUAL
) -> dict[str, Any]:
    """Sync one store's sales for [start, end); returns the counts. Safe to run twice."""
    window_start, window_end = datetime.fromisoformat(start), datetime.fromisoformat(end)
    key = services.sales_job_id(
        organization_id=organization_id,
        store_id=store_id,
        frequency=frequency,
        start=window_start,
        end=window_end,
    )
    kwargs = {
        "organization_id": organization_id,
        "store_id": store_id,
        "start": start,
        "end": end,
        "frequency": frequency,
    }
    try:
        with checkpoint(
            kind="erp-sales",
            key=key,
            func=services.SALES_TASK,
            queue=queues.ERP_SYNC,
            kwargs=kwargs,
            organization_id=organization_id,
        ):
            connection = _connection(organization_id)
            store = Store.objects.filter(pk=store_id, organization_id=organization_id).first()
            if connection is None or store is None:
                logger.info("ERP sales sync %s skipped: no enabled connection or no such store", key)
                return {"skipped": "no enabled ERP connection or no such store"}
            result = services.sales_sync(
                store=store, start=window_start, end=window_end, connection=connection
            )
    except AlreadyDone:
        logger.info("ERP sales sync %s already done; not run again", key)
        return {"skipped": "already done"}
    except IntegrationError as exc:
        _failed(organization_id, exc)
        raise
    return result.as_dict()


def erp_customers_sync(*, organization_id: int, full: bool = True, day: str = "") -> dict[str, Any]:
    """Sync the organization's customers (full: the day's; a crashed run resumes where it stopped;
    incremental: from the high-water mark); returns the counts. Safe to run twice."""
    sync_day = date.fromisoformat(day) if day else timezone.localdate()
    if full:
        key = services.customers_job_id(organization_id=organization_id, day=sync_day)
    else:  # as often as it is asked for: one run per firing
        key = f"erp-customers-{organization_id}-incremental-{_fired_at():%Y%m%d%H%M%S}"
    try:
        with checkpoint(
            kind="erp-customers",
            key=key,
            func=services.CUSTOMERS_TASK,
            queue=queues.ERP_CUSTOMER_SYNC,
            kwargs={"organization_id": organization_id, "full": full, "day": sync_day.isoformat()},
            organization_id=organization_id,
        ):
            connection = _connection(organization_id)
            if connection is None:
                logger.info("ERP customer sync %s skipped: no enabled connection", key)
                return {"skipped": "no enabled ERP connection"}
            result = services.customers_sync(connection=connection, full=full, day=sync_day)
    except AlreadyDone:
        logger.info("ERP customer sync %s already done; not run again", key)
        return {"skipped": "already done"}
    except IntegrationError as exc:
        _failed(organization_id, exc)
        raise
    return result.as_dict()


def _failed(organization_id: int, exc: IntegrationError) -> None:
    services.connection_error_record(organization_id=organization_id, error=f"{exc} {exc.details}".strip())
    if not exc.retryable:
        _give_up_retries()
        logger.error("ERP sync of organization %s failed, not retried: %s", organization_id, exc)
