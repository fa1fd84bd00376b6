"""Recurring campaigns: each cron occurrence dispatched once, under a lock, missed ones by policy."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import connection

from campaigns import lifecycle, recurring, tasks
from campaigns.models import Campaign
from crm import cron, locks, recovery
from crm.models import JobRun, Organization

SP = ZoneInfo("America/Sao_Paulo")


def _recurring(wa, cron_expr: str = "0 9 * * *", **fields) -> Campaign:
    campaign = wa["campaign"](recurrence=cron_expr, **fields)
    campaign = recurring.campaign_recurrence_activate(campaign=campaign)
    # Activated on the 1st at 08:00 São Paulo time: the first occurrence is the 1st at 09:00.
    Campaign.objects.filter(pk=campaign.pk).update(recurrence_until=datetime(2026, 12, 1, 8, 0, tzinfo=SP))
    campaign.refresh_from_db()
    return campaign


def test_each_occurrence_is_dispatched_once_at_local_time_and_sends(wa, sandbox, run_jobs):
    wa["customers"](3)
    template = _recurring(wa)
    assert template.status == Campaign.Status.RECURRING
    assert recurring.recurring_dispatch(now=datetime(2026, 12, 1, 8, 59, tzinfo=SP)) == 0
    assert recurring.recurring_dispatch(now=datetime(2026, 12, 1, 9, 2, tzinfo=SP)) == 1
    assert recurring.recurring_dispatch(now=datetime(2026, 12, 1, 9, 7, tzinfo=SP)) == 0  # not twice
    run_jobs()
    child = Campaign.objects.get(parent=template)
    assert child.occurrence_at == datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # 09:00 in São Paulo
    assert child.status == Campaign.Status.SENT and child.template_name == template.template_name
    copied = {f.attname for f in Campaign._meta.concrete_fields} - {
        "id", "name", "status", "recurrence", "recurrence_misfire", "recurrence_until", "parent_id",
        "occurrence_at", "scheduled_at", "started_at", "finished_at", "stop_reason", "created_at",
        "sent_links", "archived_at",
    }  # fmt: skip
    assert {f: getattr(child, f) for f in copied} == {f: getattr(template, f) for f in copied}
    assert sandbox.stats()["accepted"] == 3
    template.refresh_from_db()
    assert template.status == Campaign.Status.RECURRING  # the template itself never sends

    # The next day's occurrence (the 24 h conflict block would skip customers messaged "today":
    # this organization allows a daily campaign).
    Organization.objects.filter(pk=wa["org"].pk).update(
        block_multiple_campaigns=False, message_limit_count=10
    )
    assert recurring.recurring_dispatch(now=datetime(2026, 12, 2, 9, 1, tzinfo=SP)) == 1
    run_jobs()
    assert Campaign.objects.filter(parent=template).count() == 2
    assert sandbox.stats()["by_recipient_max"] == 2  # one message per occurrence


def test_two_schedulers_dispatching_together_record_one_occurrence(wa, run_jobs):
    template = _recurring(wa)
    at = datetime(2026, 12, 1, 9, 3, tzinfo=SP)
    barrier = threading.Barrier(2)
    results: list[int] = []

    def scheduler() -> None:
        barrier.wait()
        try:
            results.append(recurring.recurring_dispatch(now=at))
        finally:
            connection.close()

    threads = [threading.Thread(target=scheduler) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1]
    assert JobRun.objects.filter(kind="campaign-occurrence").count() == 1
    run_jobs()
    assert Campaign.objects.filter(parent=template).count() == 1


def test_a_held_lock_keeps_a_second_scheduler_out_and_the_watermark_guards_without_it(wa):
    _recurring(wa)
    at = datetime(2026, 12, 1, 9, 3, tzinfo=SP)
    with locks.locked("campaigns:recurring-dispatch") as got:
        assert got
        assert recurring.recurring_dispatch(now=at) == 0  # someone else is dispatching
    assert recurring.recurring_dispatch(now=at) == 1
    assert recurring.recurring_dispatch(now=at) == 0


def test_occurrences_missed_while_down_are_sent_once_or_skipped_by_policy(wa, run_jobs):
    once = _recurring(wa, name="Diária")
    skip = _recurring(wa, name="Só no horário", recurrence_misfire=Campaign.Misfire.SKIP)
    back = datetime(2026, 12, 4, 15, 0, tzinfo=SP)  # down since the 1st: 9:00 on 1st..4th missed
    assert recurring.recurring_dispatch(now=back) == 1
    run_jobs()
    [child] = Campaign.objects.filter(parent=once)
    assert child.occurrence_at == datetime(2026, 12, 4, 9, 0, tzinfo=SP)  # the latest, once
    assert not Campaign.objects.filter(parent=skip).exists()
    skip.refresh_from_db()
    assert skip.recurrence_until == datetime(2026, 12, 4, 9, 0, tzinfo=SP)  # skipped, not owed
    # the next occurrence on time goes out for both
    assert recurring.recurring_dispatch(now=datetime(2026, 12, 5, 9, 4, tzinfo=SP)) == 2


def test_a_lost_occurrence_job_is_recovered_once_and_never_sends_twice(wa, sandbox, run_jobs, redis_db):
    wa["customers"](2)
    template = _recurring(wa)
    recurring.recurring_dispatch(now=datetime(2026, 12, 1, 9, 1, tzinfo=SP))
    redis_db.flushdb()  # Redis lost the occurrence's job
    JobRun.objects.filter(kind="campaign-occurrence").update(
        started_at=datetime(2026, 1, 1, tzinfo=UTC)  # well past the grace period
    )
    assert recovery.recover()["job-runs"] == 1
    assert recovery.recover()["job-runs"] == 0  # its job is back: not twice
    run_jobs()
    child = Campaign.objects.get(parent=template)
    assert child.status == Campaign.Status.SENT
    run = JobRun.objects.get(kind="campaign-occurrence")
    assert run.status == JobRun.Status.COMPLETED
    # the job running again (a duplicate) finds it done and sends nothing more
    occurrence = child.occurrence_at.isoformat()
    assert tasks.campaign_occurrence(template.pk, occurrence) is None
    assert recurring.campaign_occurrence(campaign_id=template.pk, occurrence=child.occurrence_at) == child
    run_jobs()
    assert sandbox.stats()["accepted"] == 2 and sandbox.stats()["by_recipient_max"] == 1


def test_recurrence_needs_a_valid_cron_and_a_draft(wa, english):
    with pytest.raises(lifecycle.CampaignError, match="cannot be read as a schedule"):
        recurring.campaign_recurrence_activate(campaign=wa["campaign"](recurrence="every monday"))
    template = _recurring(wa)
    with pytest.raises(lifecycle.CampaignError, match="only a draft"):
        recurring.campaign_recurrence_activate(campaign=template)
    recurring.campaign_recurrence_stop(campaign=template)
    assert template.status == Campaign.Status.DRAFT
    assert recurring.recurring_dispatch(now=datetime(2026, 12, 9, 9, 1, tzinfo=SP)) == 0


def test_the_cron_table_has_the_recurring_dispatch_every_five_minutes():
    entry = cron.cron_table()["campaigns-recurring"]
    assert entry.cron == "*/5 * * * *"
    runs = entry.next_runs(2, after=datetime(2026, 12, 1, 9, 2, tzinfo=SP))
    assert [r.strftime("%H:%M %Z") for r in runs] == ["09:05 -03", "09:10 -03"]
    assert runs[1] - runs[0] == timedelta(minutes=5)
