"""The one enqueue function: payload rules, commit semantics, ids, delays, retries, deferral."""

from __future__ import annotations

import json
import time
import zlib
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from rq.job import JobStatus

from crm import jobs, queues
from crm.jobs import PayloadError
from tests.conftest import recorded

pytestmark = pytest.mark.django_db(transaction=True)


def test_every_queue_of_the_design_is_registered_in_priority_order():
    assert queues.QUEUE_NAMES == (
        "inbox",
        "items-p1",
        "flows",
        "campaign-trigger",
        "whatsapp-send",
        "email-send",
        "chatwoot-inbound",
        "items-p2",
        "post-sale-survey",
        "runs",
        "items-p3",
        "erp-sync-queue",
        "erp-customer-sync-queue",
        "items-p5",
        "maintenance",
    )
    assert [
        queues.items_queue(queues.JOB_PRIORITY[t]) for t in ("webhook", "manual", "queue", "schedule")
    ] == ["items-p1", "items-p2", "items-p3", "items-p5"]


def test_retry_policy_counts_attempts_like_the_seeds():
    # whatsapp-send: 2 attempts, exponential from 1 s -> one retry after 1 s
    assert queues.get_spec("whatsapp-send").retry_intervals() == [1]
    # email-send: 3 attempts, exponential from 60 s -> retries after 60 s and 120 s
    assert queues.get_spec("email-send").retry_intervals() == [60, 120]
    assert queues.get_spec("items-p5").retry_intervals() == [5, 10]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"smtp_password": "x"}, "credential"),
        ({"config": {"access_token": "x"}}, "credential"),
        ({"when": datetime(2026, 1, 1)}, "datetime"),
        ({"ids": [1, object()]}, "object"),
        ({1: "x"}, "non-string key"),
    ],
)
def test_it_refuses_payloads_that_are_not_plain_ids_and_values(kwargs, message, redis_db):
    with pytest.raises(PayloadError, match=message):
        jobs.enqueue("tests.jobs.record", queue="maintenance", kwargs=kwargs)
    assert redis_db.llen("rq:queue:maintenance") == 0


def test_it_refuses_unknown_queues():
    with pytest.raises(ValueError, match="unknown queue 'nope'"):
        jobs.enqueue("tests.jobs.record", queue="nope", kwargs={})


def test_a_job_runs_and_its_payload_is_json(run_jobs, redis_db):
    job_id = jobs.enqueue("tests.jobs.record", queue="maintenance", kwargs={"key": "a", "value": "1"})
    func, _instance, args, kwargs = json.loads(zlib.decompress(redis_db.hget(f"rq:job:{job_id}", "data")))
    assert (func, args, kwargs) == ("tests.jobs.record", [], {"key": "a", "value": "1"})
    run_jobs()
    assert recorded("a") == ["1"]
    assert jobs.fetch_job(job_id).get_status() == JobStatus.FINISHED


@pytest.mark.django_db(transaction=True)
def test_it_enqueues_only_after_the_transaction_commits(redis_db):
    with transaction.atomic():
        jobs.enqueue("tests.jobs.record", queue="maintenance", kwargs={"key": "c", "value": "1"})
        assert redis_db.llen("rq:queue:maintenance") == 0
    assert redis_db.llen("rq:queue:maintenance") == 1

    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.enqueue("tests.jobs.record", queue="maintenance", kwargs={"key": "c", "value": "2"})
        raise RuntimeError("rolled back")
    assert redis_db.llen("rq:queue:maintenance") == 1


def test_a_unique_job_id_is_enqueued_once_while_the_job_exists(run_jobs):
    for _ in range(3):
        jobs.enqueue(
            "tests.jobs.record",
            queue="erp-sync-queue",
            kwargs={"key": "u", "value": "x"},
            job_id="sync-001-nightly-2026-11-28",
            unique=True,
        )
    run_jobs()
    # kept for 25 h after finishing: the same id is still refused
    jobs.enqueue(
        "tests.jobs.record",
        queue="erp-sync-queue",
        kwargs={"key": "u", "value": "x"},
        job_id="sync-001-nightly-2026-11-28",
        unique=True,
    )
    run_jobs()
    assert recorded("u") == ["x"]
    assert jobs.get_connection().ttl("rq:job:sync-001-nightly-2026-11-28") > 24 * 3600


def test_replace_swaps_a_delayed_job_for_a_new_one(redis_db, run_jobs):
    jobs.enqueue(
        "tests.jobs.record",
        queue="campaign-trigger",
        kwargs={"key": "r", "value": "old"},
        job_id="campaign-7",
        replace=True,
        delay=3600,
    )
    jobs.enqueue(
        "tests.jobs.record",
        queue="campaign-trigger",
        kwargs={"key": "r", "value": "new"},
        job_id="campaign-7",
        replace=True,
        delay=0.5,
    )
    assert redis_db.zcard("rq:scheduled:campaign-trigger") == 1
    run_jobs()
    assert recorded("r") == ["new"]


def test_delayed_jobs_run_when_due_and_not_before(run_jobs):
    # Due in 15 s: a burst on a loaded machine (load 8 and more) still finishes well before that.
    at = timezone.now() + timedelta(seconds=15)
    jobs.enqueue("tests.jobs.record", queue="post-sale-survey", kwargs={"key": "d", "value": "1"}, at=at)
    run_jobs(settle=0)  # nothing due now, and not waiting for it
    assert recorded("d") == []
    time.sleep(max((at - timezone.now()).total_seconds(), 0) + 0.1)
    run_jobs()
    assert recorded("d") == ["1"]


def test_a_failing_job_is_tried_as_many_times_as_its_queue_says_then_failed(run_jobs, redis_db):
    job_id = jobs.enqueue("tests.jobs.fail", queue="whatsapp-send", kwargs={"key": "f"})
    run_jobs()
    assert recorded("f") == ["attempt", "attempt"]  # 2 attempts, backoff 1 s between them
    job = jobs.fetch_job(job_id)
    assert job.get_status() == JobStatus.FAILED
    assert redis_db.zscore("rq:failed:whatsapp-send", job_id) is not None
    assert "RuntimeError: boom" in job.latest_result().exc_string


def test_a_deferred_job_runs_later_without_spending_an_attempt(run_jobs):
    job_id = jobs.enqueue("tests.jobs.defer_once", queue="items-p3", kwargs={"key": "df", "seconds": 0.5})
    job = jobs.fetch_job(job_id)
    retries_before = job.retries_left
    run_jobs()
    job = jobs.fetch_job(job_id)
    assert recorded("df") == ["run", "run"]
    assert job.get_status() == JobStatus.FINISHED
    assert job.retries_left == retries_before == 2
    assert job.meta["deferrals"] == 1


@pytest.mark.parametrize("at_front", [True, False])
def test_a_job_deferred_at_front_comes_back_before_the_jobs_queued_meanwhile(redis_db, at_front):
    """A batch under way that waits for its slot (at_front) is not sent behind the queue's new work."""
    from crm import promote, workers

    deferred = jobs.enqueue(
        "tests.jobs.defer_once", queue="items-p3", kwargs={"key": "front", "seconds": 0, "at_front": at_front}
    )
    workers.make_worker(["items-p3"]).work(burst=True, max_jobs=1, logging_level="WARNING")
    assert recorded("front") == ["run"]  # it ran once and deferred
    queued = jobs.enqueue("tests.jobs.record", queue="items-p3", kwargs={"key": "front", "value": "new"})
    assert promote.promote_due(["items-p3"]) == 1
    order = jobs.get_queue("items-p3").job_ids
    assert order == ([deferred, queued] if at_front else [queued, deferred])


def test_enqueue_many_uses_one_round_trip_per_thousand_jobs(redis_db, run_jobs):
    import threading

    from redis.client import Pipeline

    calls = []
    original = Pipeline.execute
    this_thread = threading.get_ident()

    def counting(self, *a, **k):
        if threading.get_ident() == this_thread:  # not the process's inbox waker, say
            calls.append(len(self.command_stack))
        return original(self, *a, **k)

    Pipeline.execute = counting
    try:
        ids = jobs.enqueue_many(
            "tests.jobs.record",
            queue="items-p5",
            kwargs_list=({"key": "bulk", "value": str(i)} for i in range(1200)),
        )
    finally:
        Pipeline.execute = original
    assert len(ids) == len(set(ids)) == 1200
    assert redis_db.llen("rq:queue:items-p5") == 1200
    assert len(calls) == 2  # 1000 + 200
    run_jobs(["items-p5"])
    assert sorted(recorded("bulk"), key=int) == [str(i) for i in range(1200)]


def test_a_unique_delayed_job_is_scheduled_once(redis_db):
    for _ in range(2):
        jobs.enqueue(
            "tests.jobs.record",
            queue="campaign-trigger",
            kwargs={"key": "ud", "value": "1"},
            job_id="campaign-9",
            unique=True,
            delay=60,
        )
    assert redis_db.zcard("rq:scheduled:campaign-trigger") == 1


def test_each_job_outcome_is_one_log_line_with_queue_id_org_and_duration(run_jobs, caplog):
    ok = jobs.enqueue(
        "tests.jobs.record", queue="email-send", kwargs={"key": "log", "value": "1", "organization_id": 7}
    )
    bad = jobs.enqueue("tests.jobs.fail", queue="runs", kwargs={"key": "log-f"}, attempts=1)
    # A result not kept (the inbox's jobs): RQ leaves the job's status STARTED (was logged so).
    unkept = jobs.enqueue(
        "tests.jobs.record", queue="inbox", kwargs={"key": "log", "value": "2"}, result_ttl=0
    )
    with caplog.at_level("INFO", logger="crm.jobs"):
        run_jobs()
    lines = {r.job_id: r for r in caplog.records if r.name == "crm.jobs"}
    assert lines[ok].outcome == "succeeded" and lines[ok].queue == "email-send"
    assert lines[unkept].outcome == "succeeded" and lines[unkept].getMessage().startswith("job succeeded")
    assert lines[ok].organization_id == 7 and lines[ok].duration >= 0
    assert lines[bad].outcome == "failed" and lines[bad].levelname == "WARNING"


def test_json_log_lines_carry_the_extra_fields():
    import logging

    from crm.logfmt import JsonFormatter

    record = logging.LogRecord("crm.jobs", logging.INFO, __file__, 1, "job %s", ("succeeded",), None)
    record.queue, record.job_id = "email-send", "abc"
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "job succeeded"
    assert (line["queue"], line["job_id"], line["level"]) == ("email-send", "abc", "INFO")
