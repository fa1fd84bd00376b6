"""Work that cannot succeed ends for good, and the recovery pass never revives it: a job's last
attempt failing with an error that is not transient calls its app's `gives_up` at once; a job
that keeps failing with transient-looking errors is given up after MAX_REVIVALS revivals."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crm import jobs, recovery
from tests.conftest import recorded

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def given_up() -> Iterator[list[tuple[dict, str, str]]]:
    calls: list[tuple[dict, str, str]] = []

    def record(kwargs: dict, reason: str, error: BaseException | None) -> None:
        calls.append((kwargs, reason, type(error).__name__ if error else ""))

    for func in ("tests.jobs.fail", "tests.jobs.fail_transient"):
        recovery.gives_up(func)(record)
    yield calls
    for func in ("tests.jobs.fail", "tests.jobs.fail_transient"):
        recovery._GIVE_UPS.pop(func)


def test_a_permanent_error_on_the_last_attempt_gives_the_work_up_at_once(run_jobs, given_up):
    jobs.enqueue("tests.jobs.fail", queue="maintenance", kwargs={"key": "p", "message": "no such key"})
    run_jobs()
    assert given_up == [({"key": "p", "message": "no such key"}, given_up[0][1], "RuntimeError")]
    assert "RuntimeError on its last attempt: no such key" in given_up[0][1]


def test_an_attempt_that_will_be_retried_gives_nothing_up(run_jobs, given_up, redis_db):
    jobs.enqueue("tests.jobs.fail", queue="whatsapp-send", kwargs={"key": "r"}, backoff=0)
    run_jobs()
    assert recorded("r") == ["attempt", "attempt"]  # whatsapp-send: 2 attempts
    assert len(given_up) == 1  # only after the second


def test_a_transient_error_leaves_the_work_to_the_recovery_pass(run_jobs, given_up):
    jobs.enqueue("tests.jobs.fail_transient", queue="maintenance", kwargs={"key": "t"})
    run_jobs()
    assert recorded("t") == ["attempt"]
    assert given_up == []


def test_a_job_failing_at_every_revival_is_given_up_and_not_revived_again(run_jobs, given_up):
    spec = jobs.JobSpec(
        func="tests.jobs.fail_transient", queue="maintenance", kwargs={"key": "x"}, job_id="poison-1"
    )
    ended: list[bool] = []
    recovery.register("test-poison")(lambda: [] if ended else [spec])
    try:
        jobs.enqueue_specs([spec])
        run_jobs()
        for revival in range(1, recovery.MAX_REVIVALS + 1):
            assert recovery.recover()["test-poison"] == 1, f"revival {revival}"
            run_jobs()
        assert given_up == []
        assert len(recorded("x")) == recovery.MAX_REVIVALS + 1

        assert recovery.recover()["test-poison"] == 0  # given up instead of a sixth revival
        assert len(given_up) == 1
        kwargs, reason, error = given_up[0]
        assert kwargs == {"key": "x"} and error == ""
        assert f"failed again after {recovery.MAX_REVIVALS} recoveries" in reason
        assert "ConnectionError: connection reset by peer" in reason
        ended.append(True)  # what the app's gives_up does: the database no longer lists the work
        assert recovery.recover()["test-poison"] == 0
        run_jobs()
        assert len(recorded("x")) == recovery.MAX_REVIVALS + 1
    finally:
        recovery._RECOVERERS.pop("test-poison")


def test_a_lost_job_is_revived_however_often_redis_loses_it(run_jobs, given_up, redis_db):
    """Only failed jobs count: work Redis lost (flushed before it ran) is never given up."""
    spec = jobs.JobSpec(
        func="tests.jobs.record", queue="maintenance", kwargs={"key": "l", "value": "v"}, job_id="lost-1"
    )
    recovery.register("test-lost")(lambda: [spec])
    try:
        for _ in range(recovery.MAX_REVIVALS + 2):
            redis_db.flushdb()
            assert recovery.recover()["test-lost"] == 1
        assert given_up == []
    finally:
        recovery._RECOVERERS.pop("test-lost")
