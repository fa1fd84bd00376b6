"""The ERP cron entries (America/Sao_Paulo), the fan-outs' staggering and job ids, and the ids'
idempotence for the 25 hours a finished job is kept."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from rq.registry import ScheduledJobRegistry
from rq.serializers import JSONSerializer

from crm import cron, jobs, queues
from crm.models import JobRun, Store
from erp import services
from erp.schedules import ENTRIES

SP = ZoneInfo("America/Sao_Paulo")


def test_the_cron_entries_fire_at_their_sao_paulo_times():
    table = {e.name: e for e in ENTRIES}
    after = datetime(2026, 11, 29, 7, 30, tzinfo=SP)
    assert table["erp-sales-nightly"].next_runs(2, after=after) == [
        datetime(2026, 11, 30, 6, 0, tzinfo=SP),
        datetime(2026, 12, 1, 6, 0, tzinfo=SP),
    ]
    assert table["erp-sales-hourly"].next_runs(2, after=after) == [
        datetime(2026, 11, 29, 8, 0, tzinfo=SP),
        datetime(2026, 11, 29, 9, 0, tzinfo=SP),
    ]
    (daily,) = table["erp-customers-daily"].next_runs(after=after)
    assert daily == datetime(2026, 11, 30, 5, 0, tzinfo=SP)
    assert daily.astimezone(UTC).hour == 8  # 05:00 in Brasília is 08:00 UTC
    assert table["erp-sales-nightly"].queue == table["erp-sales-hourly"].queue == queues.ERP_SYNC
    assert table["erp-customers-daily"].queue == queues.ERP_CUSTOMER_SYNC
    assert {"erp-sales-nightly", "erp-sales-hourly", "erp-customers-daily"} <= set(cron.cron_table())


def test_registered_entries_are_scheduled_at_local_time(redis_db):
    cron.cron_register(table={e.name: e for e in ENTRIES})
    for name, (hour, minute) in {"erp-sales-nightly": (6, 0), "erp-customers-daily": (5, 0)}.items():
        score = redis_db.zscore(cron.CrmScheduler.scheduled_jobs_key, f"cron-{name}")
        fires_at = datetime.fromtimestamp(score, SP)
        assert (fires_at.hour, fires_at.minute) == (hour, minute)
    hourly = datetime.fromtimestamp(
        redis_db.zscore(cron.CrmScheduler.scheduled_jobs_key, "cron-erp-sales-hourly"), SP
    )
    assert (hourly.minute, hourly.second) == (0, 0)


def test_the_windows_are_yesterday_and_the_last_hour_in_the_organizations_zone():
    at = datetime(2026, 11, 29, 9, 0, 4, tzinfo=UTC)  # 06:00:04 in São Paulo
    assert services.sales_window(frequency="nightly", at=at, zone=SP) == (
        datetime(2026, 11, 28, 0, 0, tzinfo=SP),
        datetime(2026, 11, 29, 0, 0, tzinfo=SP),
    )
    assert services.sales_window(frequency="hourly", at=at, zone=SP) == (
        datetime(2026, 11, 29, 5, 0, tzinfo=SP),
        datetime(2026, 11, 29, 6, 0, tzinfo=SP),
    )
    # Just after midnight, the hourly window is the day before's last hour.
    at = datetime(2026, 11, 30, 3, 0, 2, tzinfo=UTC)  # 00:00:02 in São Paulo
    start, end = services.sales_window(frequency="hourly", at=at, zone=SP)
    assert (start, end) == (datetime(2026, 11, 29, 23, 0, tzinfo=SP), datetime(2026, 11, 30, 0, 0, tzinfo=SP))
    with pytest.raises(ValueError):
        services.sales_window(frequency="weekly", at=at, zone=SP)


def _scheduled(queue: str) -> dict[str, float]:
    registry = ScheduledJobRegistry(queue, connection=jobs.get_connection(), serializer=JSONSerializer)
    connection = jobs.get_connection()
    pairs: list[tuple[bytes | str, float]] = connection.zrange(registry.key, 0, -1, withscores=True)  # type: ignore[assignment]
    return {(k.decode() if isinstance(k, bytes) else k): score for k, score in pairs}


def test_the_nightly_fanout_staggers_the_stores_and_names_a_job_per_store_and_day(erp):
    org = erp["org"]
    extra = Store.objects.create(organization=org, erp_code="004", name="Quarta")
    stores = [*erp["stores"], extra]
    at = datetime(2026, 11, 29, 9, 0, 3, tzinfo=UTC)
    before = time.time()
    assert services.sales_sync_fanout(frequency="nightly", at=at) == 4
    after = time.time()
    scheduled = _scheduled(queues.ERP_SYNC)
    ids = [f"erp-sales-{org.pk}-{s.pk}-20261128" for s in stores]
    assert sorted(scheduled) == sorted(ids)
    for i, job_id in enumerate(ids):
        # Store i starts i * 2 min + 0-30 s after the fan-out.
        assert before + i * 120 - 1 <= scheduled[job_id] <= after + i * 120 + 30 + 1
        job = jobs.fetch_job(job_id)
        assert job.kwargs == {
            "organization_id": org.pk,
            "store_id": stores[i].pk,
            "start": "2026-11-28T00:00:00-03:00",
            "end": "2026-11-29T00:00:00-03:00",
            "frequency": "nightly",
        }
        assert job.retries_left == 2 and job.retry_intervals == [60, 120]  # 3 attempts, from 60 s
        assert job.result_ttl == 25 * 3600
    # The run is in the database before its job runs, under the same id (recoverable).
    assert set(JobRun.objects.filter(kind="erp-sales").values_list("key", flat=True)) == set(ids)

    # Firing again (a second scheduler, a retried fan-out) enqueues nothing new.
    services.sales_sync_fanout(frequency="nightly", at=at)
    assert sorted(_scheduled(queues.ERP_SYNC)) == sorted(ids)
    assert JobRun.objects.filter(kind="erp-sales").count() == 4


def test_the_hourly_fanout_names_jobs_per_store_day_and_hour(erp):
    org, stores = erp["org"], erp["stores"]
    services.sales_sync_fanout(frequency="hourly", at=datetime(2026, 11, 29, 17, 0, 1, tzinfo=UTC))
    services.sales_sync_fanout(frequency="hourly", at=datetime(2026, 11, 29, 18, 0, 1, tzinfo=UTC))
    services.sales_sync_fanout(frequency="hourly", at=datetime(2026, 11, 29, 18, 0, 40, tzinfo=UTC))
    expected = {
        f"erp-sales-{org.pk}-{s.pk}-{stamp}" for s in stores for stamp in ("2026112913", "2026112914")
    }
    assert set(_scheduled(queues.ERP_SYNC)) == expected
    job = jobs.fetch_job(f"erp-sales-{org.pk}-{stores[0].pk}-2026112914")
    assert (job.kwargs["start"], job.kwargs["end"]) == (
        "2026-11-29T14:00:00-03:00",
        "2026-11-29T15:00:00-03:00",
    )


def test_a_disabled_connection_gets_no_jobs(erp):
    erp["connection"].enabled = False
    erp["connection"].save()
    assert services.sales_sync_fanout(frequency="nightly") == 0
    assert services.customers_sync_fanout() == 0
    assert _scheduled(queues.ERP_SYNC) == {}


def test_the_daily_customer_sync_is_one_job_per_organization_and_day(erp):
    org = erp["org"]
    at = datetime(2026, 11, 29, 8, 0, 2, tzinfo=UTC)  # 05:00:02 in São Paulo
    assert services.customers_sync_fanout(at=at) == 1
    assert services.customers_sync_fanout(at=at) == 1  # the JobRun is not done yet: RQ refuses the id
    connection = jobs.get_connection()
    waiting = [j.decode() for j in connection.lrange(f"rq:queue:{queues.ERP_CUSTOMER_SYNC}", 0, -1)]
    assert waiting == [f"erp-customers-{org.pk}-20261129"]
    job = jobs.fetch_job(waiting[0])
    assert job.kwargs == {"organization_id": org.pk, "full": True, "day": "2026-11-29"}
    assert job.retries_left == 2 and job.retry_intervals == [60, 120]


def test_a_finished_job_keeps_its_id_for_25_hours_and_a_duplicate_is_refused(erp, run_jobs):
    store, sandbox = erp["store"], erp["sandbox"]
    start = datetime(2026, 11, 28, tzinfo=SP)
    job_id = services.sales_sync_enqueue(
        store=store, start=start, end=start.replace(day=29), frequency="nightly"
    )
    assert job_id == f"erp-sales-{erp['org'].pk}-{store.pk}-20261128"
    run_jobs([queues.ERP_SYNC])
    assert jobs.fetch_job(job_id).get_status() == "finished"
    ttl = jobs.get_connection().ttl(f"rq:job:{job_id}")
    assert 25 * 3600 - 60 < ttl <= 25 * 3600
    requests = len(sandbox.requests())

    # Within those 25 hours the same id is refused by RQ, even when the database would allow it.
    JobRun.objects.filter(key=job_id).update(status=JobRun.Status.FAILED)
    services.sales_sync_enqueue(store=store, start=start, end=start.replace(day=29), frequency="nightly")
    run_jobs([queues.ERP_SYNC])
    assert len(sandbox.requests()) == requests
    # And once Redis has cleaned it, the completed checkpoint still keeps the window from running twice.
    JobRun.objects.filter(key=job_id).update(status=JobRun.Status.COMPLETED)
    jobs.delete_job(job_id)
    services.sales_sync_enqueue(store=store, start=start, end=start.replace(day=29), frequency="nightly")
    run_jobs([queues.ERP_SYNC])
    assert len(sandbox.requests()) == requests
