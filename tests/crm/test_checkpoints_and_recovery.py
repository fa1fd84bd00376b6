"""JobRun checkpoints, locks, and the recovery pass that makes losing Redis lose nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from crm import jobs, locks, recovery
from crm.checkpoints import AlreadyDone, checkpoint, jobrun_enqueue, jobrun_start
from crm.models import JobRun
from tests.conftest import recorded

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_checkpoint_is_written_before_the_work_and_completed_after():
    with checkpoint(kind="sync", key="k1") as run:
        assert JobRun.objects.get(pk=run.pk).status == JobRun.Status.RUNNING
    run.refresh_from_db()
    assert run.status == JobRun.Status.COMPLETED
    assert run.finished_at >= run.started_at
    assert run.attempts == 1


def test_a_failed_checkpoint_keeps_the_error_and_can_be_resumed():
    with pytest.raises(ValueError), checkpoint(kind="sync", key="k2"):
        raise ValueError("ERP answered 503")
    run = JobRun.objects.get(kind="sync", key="k2")
    assert run.status == JobRun.Status.FAILED
    assert "ValueError: ERP answered 503" in run.error
    with checkpoint(kind="sync", key="k2"):
        pass
    run.refresh_from_db()
    assert (run.status, run.attempts, run.error) == (JobRun.Status.COMPLETED, 2, "")


def test_a_completed_checkpoint_refuses_to_run_again():
    with checkpoint(kind="dispatch", key="campaign-1"):
        pass
    with pytest.raises(AlreadyDone):
        jobrun_start(kind="dispatch", key="campaign-1")


def test_losing_redis_loses_no_recorded_work(redis_db, run_jobs):
    for n in range(3):
        jobrun_enqueue(
            kind="test-run",
            key=f"r{n}",
            func="tests.jobs.checkpointed",
            queue="runs",
            kwargs={"kind": "test-run", "key": f"r{n}"},
        )
    assert redis_db.llen("rq:queue:runs") == 3
    redis_db.flushdb()  # Redis restarted without persistence
    JobRun.objects.update(started_at=timezone.now() - timedelta(minutes=1))

    assert recovery.recover()["job-runs"] == 3
    assert recovery.recover()["job-runs"] == 0  # already queued again: nothing twice
    run_jobs()
    assert sorted(recorded("test-run")) == ["r0", "r1", "r2"]
    assert set(JobRun.objects.values_list("status", flat=True)) == {JobRun.Status.COMPLETED}
    assert recovery.recover()["job-runs"] == 0


def test_a_young_run_is_left_alone_its_enqueue_may_still_be_committing(redis_db):
    jobrun_enqueue(
        kind="test-run",
        key="young",
        func="tests.jobs.checkpointed",
        queue="runs",
        kwargs={"kind": "test-run", "key": "young"},
    )
    redis_db.flushdb()
    assert recovery.recover()["job-runs"] == 0


def test_a_run_whose_job_died_is_redispatched_only_when_stale(redis_db, run_jobs, settings):
    run = jobrun_enqueue(
        kind="test-run",
        key="dead",
        func="tests.jobs.checkpointed",
        queue="runs",
        kwargs={"kind": "test-run", "key": "dead"},
    )
    # The job "ran" and was killed: RQ marked it failed, the checkpoint still says running.
    job = jobs.fetch_job(run.job_id)
    redis_db.lrem("rq:queue:runs", 0, job.id)
    job.set_status("failed")
    JobRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(minutes=5))
    assert recovery.recover()["job-runs"] == 0  # not yet stale (CRM_STALE_RUN_AFTER = 10 min)
    JobRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(minutes=11))
    assert recovery.recover(dry_run=True)["job-runs"] == 1
    assert recovery.recover()["job-runs"] == 1
    run_jobs()
    assert recorded("test-run") == ["dead"]


def test_a_run_that_keeps_dying_is_given_up(redis_db):
    run = jobrun_enqueue(
        kind="test-run",
        key="oom",
        func="tests.jobs.checkpointed",
        queue="runs",
        kwargs={"kind": "test-run", "key": "oom"},
    )
    redis_db.flushdb()
    JobRun.objects.filter(pk=run.pk).update(
        started_at=timezone.now() - timedelta(minutes=1), attempts=recovery.MAX_ATTEMPTS
    )
    assert recovery.recover()["job-runs"] == 0
    run.refresh_from_db()
    assert run.status == JobRun.Status.FAILED
    assert "given up" in run.error


def test_registered_recoverers_requeue_only_what_redis_lost(redis_db, run_jobs):
    specs = [
        jobs.JobSpec(
            func="tests.jobs.record",
            queue="whatsapp-send",
            kwargs={"key": "rec", "value": str(i)},
            job_id=f"wa-{i}",
        )
        for i in range(5)
    ]
    jobs.enqueue_specs(specs[:2])  # two are still queued, three were lost

    @recovery.register("test-messages")
    def _unfinished():
        return specs

    try:
        assert recovery.recover()["test-messages"] == 3
        run_jobs()
        assert sorted(recorded("rec")) == ["0", "1", "2", "3", "4"]
    finally:
        recovery._RECOVERERS.pop("test-messages")


def test_a_lock_has_one_owner_and_only_the_owner_releases_it(redis_db):
    first = locks.lock_acquire("campaign:42", ttl=300)
    assert first is not None
    assert locks.lock_acquire("campaign:42") is None
    assert 0 < redis_db.ttl("crm:lock:campaign:42") <= 300
    redis_db.delete("crm:lock:campaign:42")  # it expired ...
    second = locks.lock_acquire("campaign:42")  # ... and someone else took it
    assert second is not None
    assert locks.lock_release(first) is False  # the old owner cannot release the new owner's lock
    assert redis_db.exists("crm:lock:campaign:42")
    assert locks.lock_release(second) is True
    with locks.locked("campaign:42") as got:
        assert got
        with locks.locked("campaign:42") as again:
            assert not again
