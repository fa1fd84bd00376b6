"""The sync jobs on a real (in-process) RQ worker: a 5xx is retried, a 4xx fails at once, a window
already done is not synced again, and the cron entry reaches the stores through the fan-out."""

from __future__ import annotations

from datetime import datetime, timedelta

from crm import cron, jobs, queues
from crm.models import JobRun, Sale
from erp import services
from erp.models import ErpConnection
from project.sandboxes.millennium_data import OFFSET
from tests.erp.conftest import recent_day


def _sales_kwargs(erp) -> dict:
    day = recent_day()
    start = datetime(day.year, day.month, day.day, tzinfo=OFFSET)
    return {
        "organization_id": erp["org"].pk,
        "store_id": erp["store"].pk,
        "start": start.isoformat(),
        "end": (start + timedelta(days=1)).isoformat(),
        "frequency": "nightly",
    }


def test_a_5xx_is_retried_and_the_retry_completes_the_sync(erp, run_jobs):
    sandbox = erp["sandbox"]
    sandbox.fail_next(1, 503)
    kwargs = _sales_kwargs(erp)
    # The queue's own policy (3 attempts, 60 s then 120 s) with the backoff shortened for the test.
    job_id = jobs.enqueue(
        "erp.tasks.erp_sales_sync", queue=queues.ERP_SYNC, kwargs=kwargs, job_id="t-5xx", backoff=1
    )
    run_jobs([queues.ERP_SYNC])
    statuses = [(r["params"]["trans_id"], r["status"]) for r in sandbox.requests()]
    assert statuses[:2] == [("0", 503), ("0", 200)]
    assert jobs.fetch_job(job_id).get_status() == "finished"
    assert Sale.objects.filter(store=erp["store"]).count() == 24
    run = JobRun.objects.get(kind="erp-sales")
    assert run.status == JobRun.Status.COMPLETED and run.attempts == 2
    assert run.key == f"erp-sales-{erp['org'].pk}-{erp['store'].pk}-{recent_day():%Y%m%d}"


def test_a_4xx_fails_at_once_and_is_not_retried(erp, run_jobs):
    connection, sandbox = erp["connection"], erp["sandbox"]
    connection.set_password("not-the-password")
    connection.save()
    job_id = jobs.enqueue(
        "erp.tasks.erp_sales_sync",
        queue=queues.ERP_SYNC,
        kwargs=_sales_kwargs(erp),
        job_id="t-4xx",
        backoff=1,
    )
    run_jobs([queues.ERP_SYNC])
    assert [r["status"] for r in sandbox.requests()] == [401]  # asked once
    job = jobs.fetch_job(job_id)
    assert job.get_status() == "failed"
    assert Sale.objects.count() == 0
    run = JobRun.objects.get(kind="erp-sales")
    assert run.status == JobRun.Status.FAILED and "HTTP 401" in run.error
    connection = ErpConnection.objects.get(pk=connection.pk)
    assert "HTTP 401" in connection.last_error and connection.last_error_at is not None
    assert "not-the-password" not in connection.last_error


def test_a_customer_sync_5xx_mid_way_is_retried_from_the_saved_trans_id(erp, run_jobs):
    sandbox = erp["sandbox"]
    sandbox.fail_next(1, 500, after=1)  # the second page fails once
    job_id = jobs.enqueue(
        "erp.tasks.erp_customers_sync",
        queue=queues.ERP_CUSTOMER_SYNC,
        kwargs={"organization_id": erp["org"].pk, "full": True, "day": recent_day().isoformat()},
        job_id="t-customers",
        backoff=1,
    )
    run_jobs([queues.ERP_CUSTOMER_SYNC])
    asked = [(r["params"]["trans_id"], r["status"]) for r in sandbox.requests()]
    assert asked == [("0", 200), ("10000", 500), ("10000", 200), ("20000", 200), ("25000", 200)]
    assert jobs.fetch_job(job_id).get_status() == "finished"
    assert erp["org"].customers.count() == 2500


def test_a_window_already_synced_is_not_synced_again_by_a_job(erp, run_jobs):
    sandbox = erp["sandbox"]
    kwargs = _sales_kwargs(erp)
    jobs.enqueue("erp.tasks.erp_sales_sync", queue=queues.ERP_SYNC, kwargs=kwargs, job_id="t-once")
    run_jobs([queues.ERP_SYNC])
    asked = len(sandbox.requests())
    second = jobs.enqueue("erp.tasks.erp_sales_sync", queue=queues.ERP_SYNC, kwargs=kwargs, job_id="t-twice")
    run_jobs([queues.ERP_SYNC])
    assert len(sandbox.requests()) == asked
    assert jobs.fetch_job(second).return_value() == {"skipped": "already done"}


def test_the_hourly_cron_entry_fans_out_to_every_store(erp, run_jobs):
    erp["sandbox"].set_latency(0)
    job_id = cron.cron_fire("erp-sales-hourly", manual=True)
    run_jobs([queues.ERP_SYNC], settle=0.5)
    assert jobs.fetch_job(job_id).return_value() == 3
    scheduled = JobRun.objects.filter(kind="erp-sales").values_list("key", flat=True)
    assert len(scheduled) == 3 and all(k.startswith(f"erp-sales-{erp['org'].pk}-") for k in scheduled)


def test_a_connection_turned_off_after_the_fanout_skips_quietly(erp, run_jobs):
    services.sales_sync_enqueue(
        store=erp["store"],
        start=datetime(2026, 11, 28, tzinfo=OFFSET),
        end=datetime(2026, 11, 29, tzinfo=OFFSET),
        frequency="nightly",
    )
    ErpConnection.objects.update(enabled=False)
    run_jobs([queues.ERP_SYNC])
    assert erp["sandbox"].requests() == []
    # Its run is settled, so the recovery pass does not dispatch it again and again.
    assert JobRun.objects.get(kind="erp-sales").status == JobRun.Status.COMPLETED
