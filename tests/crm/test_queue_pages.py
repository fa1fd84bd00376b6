"""The queue pages under /admin/queues/: counts, lists, search, a job's detail and the operators'
actions, on real jobs in a real Redis run by real (in-process) workers."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from crm import jobs, queue_ops, queues, stats, workers
from tests.conftest import recorded, wait_for
from tests.jobs import release

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL_BATCH = "campaigns.tasks.email_send_batch"  # only enqueued here, never run


@pytest.fixture
def staff_client(client, english):
    user = get_user_model().objects.create_user(
        "ops", password="pw-ops-123", is_staff=True, is_superuser=True
    )
    client.force_login(user)
    return client


class _Rows(HTMLParser):
    """Every <tr> of a page: its attributes and its cells' (attributes, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, Any]] = []
        self._cell: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append({"attrs": dict(attrs), "cells": []})
        elif tag in ("td", "th") and self.rows:
            self._cell = {"attrs": dict(attrs), "text": ""}
            self.rows[-1]["cells"].append(self._cell)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell["text"] += data


def _rows(response) -> list[dict[str, Any]]:
    parser = _Rows()
    parser.feed(response.content.decode())
    return parser.rows


def _cells(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["attrs"].get("class", ""): {**c, "text": c["text"].strip()} for c in row["cells"]}


def _job_rows(response) -> list[dict[str, Any]]:
    return [r for r in _rows(response) if r["attrs"].get("class") == "job"]


def _ids(response) -> list[str]:
    return [r["attrs"]["data-job-id"] for r in _job_rows(response)]


def _messages(response) -> list[str]:
    """The messages this response set; they are dropped from the client so the next one starts clean."""
    found = [str(m) for m in get_messages(response.wsgi_request)]
    response.client.cookies.pop("messages", None)
    return found


def _job(job_id: str) -> Job | None:
    return jobs.fetch_job(job_id)


def _connection():
    return jobs.get_connection()


def test_the_overview_lists_every_queue_in_worker_order_with_redis_counts_and_workers(staff_client, run_jobs):
    for i in range(3):
        jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "s", "value": str(i)})
    jobs.enqueue("tests.jobs.fail", queue="runs", kwargs={"key": "f"}, attempts=1)
    run_jobs()
    jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "s", "value": "w"})
    jobs.enqueue("tests.jobs.record", queue="post-sale-survey", kwargs={"key": "s", "value": "d"}, delay=3600)
    worker = workers.make_worker(["email-send", "runs"])
    worker.register_birth()

    response = staff_client.get("/admin/queues/")
    assert response.status_code == 200
    rows = [r for r in _rows(response) if r["attrs"].get("id", "").startswith("queue-")]
    assert [r["attrs"]["id"] for r in rows] == [f"queue-{name}" for name in queues.QUEUE_NAMES]
    expected = stats.queue_stats()
    assert expected["email-send"] == {"waiting": 1, "active": 0, "delayed": 0, "completed": 3, "failed": 0}
    assert expected["runs"]["failed"] == 1 and expected["post-sale-survey"]["delayed"] == 1
    for name, row in zip(queues.QUEUE_NAMES, rows, strict=True):
        cells = _cells(row)
        assert {s: int(cells[s]["text"]) for s in queue_ops.STATES} == expected[name]
        listens = name in ("email-send", "runs")
        assert cells["workers"]["text"] == ("1" if listens else "0")
        assert (worker.name in cells["workers"]["attrs"]["title"]) is listens
    assert 'href="/admin/queues/runs/failed/"' in response.content.decode()
    oldest = _cells(rows[queues.QUEUE_NAMES.index("email-send")])["oldest"]["text"]
    assert oldest.endswith("s") and oldest != "—"
    assert "setInterval(refresh, 3000)" in response.content.decode()

    data = staff_client.get("/admin/queues/", {"format": "json"}).json()["queues"]
    assert [q["name"] for q in data] == list(queues.QUEUE_NAMES)
    by_name = {q["name"]: q for q in data}
    assert {s: by_name["runs"][s] for s in queue_ops.STATES} == expected["runs"]
    assert by_name["email-send"]["worker_names"] == [worker.name]
    assert by_name["email-send"]["oldest_waiting_seconds"] >= 0
    assert by_name["items-p1"]["oldest_waiting_seconds"] is None


def test_a_list_shows_fifty_jobs_a_page_newest_first(staff_client):
    jobs.enqueue_many(
        EMAIL_BATCH,
        queue="email-send",
        kwargs_list=[{"campaign_id": 1000 + i, "batch": i} for i in range(120)],
        job_ids=[f"mail-{i:03d}" for i in range(120)],
    )
    first = staff_client.get("/admin/queues/email-send/waiting/")
    assert first.status_code == 200
    assert _ids(first) == [f"mail-{i:03d}" for i in range(119, 69, -1)]
    row = _cells(_job_rows(first)[0])
    assert row["function"]["text"] == EMAIL_BATCH
    assert row["arguments"]["text"] == "campaign_id=1119, batch=119"
    assert row["attempts"]["text"] == "3"  # email-send: 3 attempts, none spent
    assert "120 jobs." in first.content.decode()

    third = staff_client.get("/admin/queues/email-send/waiting/", {"page": 3})
    assert _ids(third) == [f"mail-{i:03d}" for i in range(19, -1, -1)]
    assert 'rel="next"' not in third.content.decode()
    beyond = staff_client.get("/admin/queues/email-send/waiting/", {"page": 99})
    assert _ids(beyond) == _ids(third)
    assert _ids(staff_client.get("/admin/queues/email-send/completed/")) == []


def test_search_matches_a_job_id_or_a_value_of_its_arguments(staff_client, monkeypatch):
    jobs.enqueue_many(
        EMAIL_BATCH,
        queue="email-send",
        kwargs_list=[
            {"campaign_id": 42, "batch": 1},
            {"campaign_id": 142, "batch": 2},
            {"campaign_id": 420, "batch": 3},
            {"campaign_id": 42, "batch": 4},
        ],
        job_ids=["eb-a", "eb-b", "eb-c", "eb-d"],
    )
    jobs.enqueue_many(
        "runner.jobs.item_job",
        queue="email-send",
        kwargs_list=[{"external_ids": ["ord-ABC-17", "x"]}, {"external_ids": ["ord-XYZ"]}],
        job_ids=["item-1", "item-2"],
    )
    url = "/admin/queues/email-send/waiting/"

    by_campaign = staff_client.get(url, {"q": "42"})
    assert _ids(by_campaign) == ["eb-d", "eb-a"]  # exact number: not 142 or 420
    assert "2 jobs match “42” among the 6 searched." in by_campaign.content.decode()
    assert _ids(staff_client.get(url, {"q": "abc-1"})) == ["item-1"]  # substring of a string value
    assert _ids(staff_client.get(url, {"q": "eb-"})) == ["eb-d", "eb-c", "eb-b", "eb-a"]  # by id
    assert _ids(staff_client.get(url, {"q": "nothing-like-it"})) == []
    assert "search-capped" not in by_campaign.content.decode()

    # Past the cap only the newest jobs are searched, and the page says so.
    monkeypatch.setattr(queue_ops, "SEARCH_LIMIT", 4)
    monkeypatch.setattr(queue_ops, "SEARCH_CHUNK", 3)
    capped = staff_client.get(url, {"q": "42"})
    assert _ids(capped) == ["eb-d"]
    assert "Only the newest 4 jobs of this list were searched." in capped.content.decode()


def test_a_search_lists_each_job_once_while_new_jobs_shift_the_list(staff_client, monkeypatch):
    jobs.enqueue_many(
        EMAIL_BATCH,
        queue="email-send",
        kwargs_list=[{"campaign_id": 7, "batch": b} for b in range(4)],
        job_ids=[f"s-{b}" for b in range(4)],
    )
    monkeypatch.setattr(queue_ops, "SEARCH_CHUNK", 2)
    real_range = queue_ops._range
    calls = []

    def range_then_a_job_arrives(*args, **kwargs):  # the real read; a new job lands after the first
        entries = real_range(*args, **kwargs)
        calls.append(len(entries))
        if len(calls) == 1:
            jobs.enqueue(
                EMAIL_BATCH, queue="email-send", kwargs={"campaign_id": 8, "batch": 9}, job_id="late"
            )
        return entries

    monkeypatch.setattr(queue_ops, "_range", range_then_a_job_arrives)
    found = _ids(staff_client.get("/admin/queues/email-send/waiting/", {"q": "7"}))
    # The newest first; the late job pushed the list one place, so the second chunk met s-2 again
    # (listed once) and the last of the four searched positions now held s-1.
    assert found == ["s-3", "s-2", "s-1"], found


def test_a_failed_job_shows_its_exception_in_the_list_and_its_traceback_in_detail(staff_client, run_jobs):
    job_id = jobs.enqueue(
        "tests.jobs.fail",
        queue="runs",
        kwargs={"key": "f", "message": "kaboom 7"},
        attempts=1,
        job_id="broken",
    )
    run_jobs(["runs"])

    listing = staff_client.get("/admin/queues/runs/failed/")
    row = _cells(_job_rows(listing)[0])
    assert row["exception"]["text"] == "RuntimeError: kaboom 7"
    assert row["attempts"]["text"] == "0"

    detail = staff_client.get(f"/admin/queues/jobs/{job_id}/")
    assert detail.status_code == 200
    page = detail.content.decode()
    traceback = page.split('<pre class="traceback">', 1)[1].split("</pre>", 1)[0]
    assert traceback.startswith("Traceback (most recent call last):")
    assert "tests/jobs.py" in traceback and traceback.rstrip().endswith("RuntimeError: kaboom 7")
    assert "&quot;message&quot;: &quot;kaboom 7&quot;" in page  # kwargs, pretty JSON
    assert 'value="retry"' in page and 'value="delete"' in page
    assert 'value="promote"' not in page and 'value="cancel"' not in page
    assert staff_client.get("/admin/queues/jobs/no-such-job/").status_code == 404


def test_retry_puts_a_failed_job_back_with_the_queues_attempts_and_it_succeeds(staff_client, run_jobs):
    jobs.enqueue(
        "tests.jobs.fails_first_run", queue="runs", kwargs={"key": "flaky"}, attempts=1, job_id="flaky"
    )
    run_jobs(["runs"])
    assert _job("flaky").get_status() == JobStatus.FAILED

    response = staff_client.post("/admin/queues/jobs/flaky/retry/", {"next": "/admin/queues/runs/failed/"})
    assert response.status_code == 302 and response["Location"] == "/admin/queues/runs/failed/"
    assert _messages(response) == ["Job flaky is back on runs with 3 attempts."]
    job = _job("flaky")
    assert job.get_status() == JobStatus.QUEUED and job.retries_left == 2
    assert _connection().lrange("rq:queue:runs", 0, -1) == [b"flaky"]
    assert _connection().zcard("rq:failed:runs") == 0
    assert _connection().ttl(job.key) == -1  # the failure TTL is gone: it cannot expire while waiting

    run_jobs(["runs"])
    assert _job("flaky").get_status() == JobStatus.FINISHED
    assert recorded("flaky") == ["run", "run"]

    again = staff_client.post("/admin/queues/jobs/flaky/retry/")
    assert _messages(again) == ["Only a failed job can be retried; job flaky is completed."]
    assert _job("flaky").get_status() == JobStatus.FINISHED
    assert _connection().llen("rq:queue:runs") == 0


def test_delete_removes_a_job_from_everywhere(staff_client, run_jobs):
    jobs.enqueue("tests.jobs.fail", queue="runs", kwargs={"key": "f"}, attempts=1, job_id="gone-failed")
    run_jobs(["runs"])
    jobs.enqueue(
        "tests.jobs.record", queue="email-send", kwargs={"key": "r", "value": "1"}, job_id="gone-waiting"
    )
    connection = _connection()
    assert connection.exists("rq:results:gone-failed")

    response = staff_client.post("/admin/queues/jobs/gone-failed/delete/")
    assert response.status_code == 302 and response["Location"] == "/admin/queues/"
    assert _messages(response) == ["Job gone-failed was deleted from runs."]
    assert not connection.exists("rq:job:gone-failed", "rq:results:gone-failed")
    assert connection.zcard("rq:failed:runs") == 0

    waiting = staff_client.post("/admin/queues/jobs/gone-waiting/delete/")
    assert _messages(waiting) == ["Job gone-waiting was deleted from email-send."]
    assert _job("gone-waiting") is None and connection.llen("rq:queue:email-send") == 0
    run_jobs(["email-send"])
    assert recorded("r") == []

    missing = staff_client.post("/admin/queues/jobs/gone-waiting/delete/")
    assert _messages(missing) == ["Job gone-waiting no longer exists."]


def test_a_running_job_cannot_be_deleted_and_ends_normally(staff_client, worker_process):
    """Deleting does not stop a running job, and its worker would write it back when it ends, so
    the page offers no delete while it runs and refuses one that is posted anyway."""
    jobs.enqueue("tests.jobs.hold", queue="runs", kwargs={"key": "s"}, job_id="busy")
    worker = worker_process("--queues", "runs", "--burst")
    wait_for(
        lambda: (job := _job("busy")) is not None and job.get_status() == JobStatus.STARTED,
        timeout=120,
        what="the worker to start the job",
    )

    page = staff_client.get("/admin/queues/jobs/busy/").content.decode()
    assert "/admin/queues/jobs/busy/delete/" not in page
    refused = staff_client.post("/admin/queues/jobs/busy/delete/")
    assert _messages(refused) == ["Job busy could not be deleted: it is running."]
    release("s")
    assert worker.wait(timeout=120) == 0
    assert recorded("s") and _job("busy").get_status() == JobStatus.FINISHED
    deleted = staff_client.post("/admin/queues/jobs/busy/delete/")
    assert _messages(deleted) == ["Job busy was deleted from runs."] and _job("busy") is None


def test_promote_runs_a_delayed_job_now(staff_client, run_jobs):
    jobs.enqueue(
        "tests.jobs.record",
        queue="post-sale-survey",
        kwargs={"key": "p", "value": "x"},
        delay=3600,
        job_id="later",
    )
    jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "p", "value": "y"}, job_id="now")
    listing = staff_client.get("/admin/queues/post-sale-survey/delayed/")
    assert _ids(listing) == ["later"] and _cells(_job_rows(listing)[0])["due"]["text"]
    assert 'value="promote"' in staff_client.get("/admin/queues/jobs/later/").content.decode()

    response = staff_client.post("/admin/queues/jobs/later/promote/")
    assert _messages(response) == ["Job later is on post-sale-survey to run now."]
    assert _job("later").get_status() == JobStatus.QUEUED
    assert _connection().zcard("rq:scheduled:post-sale-survey") == 0
    run_jobs(["post-sale-survey"])
    assert recorded("p") == ["x"]

    wrong = staff_client.post("/admin/queues/jobs/now/promote/")
    assert _messages(wrong) == ["Only a delayed job can be run now; job now is waiting."]
    assert _connection().lrange("rq:queue:email-send", 0, -1) == [b"now"]


def test_cancel_takes_a_waiting_job_off_its_queue(staff_client, run_jobs):
    jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "c", "value": "1"}, job_id="stop-me")
    jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "c", "value": "2"}, job_id="keep-me")
    assert 'value="cancel"' in staff_client.get("/admin/queues/jobs/stop-me/").content.decode()

    response = staff_client.post("/admin/queues/jobs/stop-me/cancel/")
    assert _messages(response) == ["Job stop-me was canceled and taken off email-send."]
    job = _job("stop-me")
    assert job.get_status() == JobStatus.CANCELED
    assert 0 < _connection().ttl(job.key) <= queues.get_spec("email-send").result_ttl
    assert _connection().lrange("rq:queue:email-send", 0, -1) == [b"keep-me"]
    run_jobs(["email-send"])
    assert recorded("c") == ["2"]

    wrong = staff_client.post("/admin/queues/jobs/keep-me/cancel/")
    assert _messages(wrong) == ["Only a waiting job can be canceled; job keep-me is completed."]
    assert _job("keep-me").get_status() == JobStatus.FINISHED


def test_empty_names_the_count_then_removes_the_waiting_jobs_and_their_hashes(staff_client):
    jobs.enqueue_many(
        "tests.jobs.record",
        queue="email-send",
        kwargs_list=[{"key": "e", "value": str(i)} for i in range(1205)],
        job_ids=[f"e-{i}" for i in range(1205)],
    )
    jobs.enqueue("tests.jobs.record", queue="runs", kwargs={"key": "e", "value": "other"}, job_id="other")

    confirm = staff_client.get("/admin/queues/email-send/waiting/empty/")
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert "Remove all 1205 waiting jobs of email-send?" in page
    assert "is enqueued again by the recovery pass, which runs every minute" in page
    assert 'name="count" value="1205"' in page

    # Jobs that arrive after the confirmation was shown are left alone.
    jobs.enqueue_many(
        "tests.jobs.record",
        queue="email-send",
        kwargs_list=[{"key": "e", "value": "late"}] * 2,
        job_ids=["late-1", "late-2"],
    )
    response = staff_client.post("/admin/queues/email-send/waiting/empty/", {"count": "1205"})
    assert response.status_code == 302 and response["Location"] == "/admin/queues/email-send/waiting/"
    assert _messages(response) == ["1205 waiting jobs removed from email-send."]
    connection = _connection()
    assert connection.lrange("rq:queue:email-send", 0, -1) == [b"late-1", b"late-2"]
    assert not any(connection.exists(f"rq:job:e-{i}") for i in (0, 999, 1000, 1204))
    assert sorted(connection.scan_iter("rq:job:*", count=1000)) == [
        b"rq:job:late-1",
        b"rq:job:late-2",
        b"rq:job:other",
    ]
    assert connection.llen("rq:queue:runs") == 1


def test_retry_all_puts_every_failed_job_back_and_they_succeed(staff_client, run_jobs):
    for i in range(3):
        jobs.enqueue(
            "tests.jobs.fails_first_run",
            queue="runs",
            kwargs={"key": f"ra-{i}"},
            attempts=1,
            job_id=f"ra-{i}",
        )
    run_jobs(["runs"])
    assert _connection().zcard("rq:failed:runs") == 3

    confirm = staff_client.get("/admin/queues/runs/failed/retry-all/")
    assert "Retry all 3 failed jobs of runs?" in confirm.content.decode()
    response = staff_client.post("/admin/queues/runs/failed/retry-all/", {"count": "3"})
    assert _messages(response) == ["3 failed jobs of runs are back on their queue."]
    assert _connection().zcard("rq:failed:runs") == 0
    assert {
        j.retries_left for j in Job.fetch_many([f"ra-{i}" for i in range(3)], _connection(), JSONSerializer)
    } == {2}

    run_jobs(["runs"])
    assert [_job(f"ra-{i}").get_status() for i in range(3)] == [JobStatus.FINISHED] * 3
    assert [recorded(f"ra-{i}") for i in range(3)] == [["run", "run"]] * 3


def test_delete_all_failed_and_promote_all_delayed(staff_client, run_jobs):
    for i in range(2):
        jobs.enqueue("tests.jobs.fail", queue="runs", kwargs={"key": "d"}, attempts=1, job_id=f"df-{i}")
    run_jobs(["runs"])
    for i in range(3):
        jobs.enqueue(
            "tests.jobs.record", queue="post-sale-survey", kwargs={"key": "pa", "value": str(i)}, delay=3600
        )

    assert (
        "Delete all 2 failed jobs of runs?"
        in staff_client.get("/admin/queues/runs/failed/delete-all/").content.decode()
    )
    deleted = staff_client.post("/admin/queues/runs/failed/delete-all/")
    assert _messages(deleted) == ["2 failed jobs of runs deleted."]
    assert _connection().zcard("rq:failed:runs") == 0
    assert _job("df-0") is None and _job("df-1") is None

    confirm = staff_client.get("/admin/queues/post-sale-survey/delayed/promote-all/")
    assert "Run all 3 delayed jobs of post-sale-survey now?" in confirm.content.decode()
    promoted = staff_client.post("/admin/queues/post-sale-survey/delayed/promote-all/", {"count": "3"})
    assert _messages(promoted) == ["3 delayed jobs of post-sale-survey are on their queue to run now."]
    assert _connection().zcard("rq:scheduled:post-sale-survey") == 0
    run_jobs(["post-sale-survey"])
    assert sorted(recorded("pa")) == ["0", "1", "2"]


def test_unknown_queues_states_and_actions_are_not_found(staff_client):
    jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "u", "value": "1"}, job_id="u1")
    assert staff_client.get("/admin/queues/nope/waiting/").status_code == 404
    assert staff_client.get("/admin/queues/email-send/sleeping/").status_code == 404
    assert (
        staff_client.get("/admin/queues/email-send/waiting/retry-all/").status_code == 404
    )  # not on waiting
    assert staff_client.post("/admin/queues/jobs/u1/explode/").status_code == 404
    assert staff_client.get("/admin/queues/jobs/u1/delete/").status_code == 405  # actions are POST only
    assert _job("u1").get_status() == JobStatus.QUEUED


def _snapshot() -> dict[str, Any]:
    connection = _connection()
    state: dict[str, Any] = {}
    for name in ("runs", "email-send", "post-sale-survey"):
        state[name] = (
            connection.lrange(f"rq:queue:{name}", 0, -1),
            connection.zrange(f"rq:failed:{name}", 0, -1),
            connection.zrange(f"rq:scheduled:{name}", 0, -1),
            connection.zrange(f"rq:canceled:{name}", 0, -1),
        )
    state["jobs"] = {k: connection.hget(k, "status") for k in connection.scan_iter("rq:job:*", count=1000)}
    return state


@pytest.mark.parametrize("who", ["anonymous", "not staff"])
def test_anyone_but_staff_is_sent_to_the_login_and_nothing_changes(client, run_jobs, who):
    if who == "not staff":
        client.force_login(get_user_model().objects.create_user("seller", password="pw-seller-123"))
    jobs.enqueue("tests.jobs.fail", queue="runs", kwargs={"key": "n"}, attempts=1, job_id="n-failed")
    run_jobs(["runs"])
    jobs.enqueue(
        "tests.jobs.record", queue="email-send", kwargs={"key": "n", "value": "1"}, job_id="n-waiting"
    )
    jobs.enqueue(
        "tests.jobs.record",
        queue="post-sale-survey",
        kwargs={"key": "n", "value": "2"},
        delay=3600,
        job_id="n-later",
    )
    before = _snapshot()

    pages = [
        "/admin/queues/",
        "/admin/queues/?format=json",
        "/admin/queues/runs/failed/",
        "/admin/queues/runs/failed/?q=n",
        "/admin/queues/jobs/n-failed/",
        "/admin/queues/runs/failed/retry-all/",
        "/admin/queues/email-send/waiting/empty/",
    ]
    posts = [
        "/admin/queues/jobs/n-failed/retry/",
        "/admin/queues/jobs/n-failed/delete/",
        "/admin/queues/jobs/n-later/promote/",
        "/admin/queues/jobs/n-waiting/cancel/",
        "/admin/queues/jobs/n-waiting/delete/",
        "/admin/queues/runs/failed/retry-all/",
        "/admin/queues/runs/failed/delete-all/",
        "/admin/queues/email-send/waiting/empty/",
        "/admin/queues/post-sale-survey/delayed/promote-all/",
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), url
    for url in posts:
        response = client.post(url, {"count": "10"})
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), url
    assert _snapshot() == before
    assert before["email-send"][0] == [b"n-waiting"] and before["runs"][1] == [b"n-failed"]
