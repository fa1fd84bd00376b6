"""What other RQ clients put on the product's Redis never stops a product worker: a job in RQ's
default (pickle) format is failed with a clear reason and the worker goes on; a worker that does
die of an error exits non-zero, so its supervisor restarts it."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.suspension import is_suspended

from crm import cron, jobs
from tests.conftest import ROOT, child_env, free_port, recorded, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RQ = str(Path(sys.executable).with_name("rq"))
ARGS = ["tests.jobs.record", "key=pickled", "value=rq-enqueue"]


def redis_url() -> str:
    """The test Redis as a URL the stock RQ tools accept."""
    kwargs = jobs.get_connection().connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    return f"redis://{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def _failed_reason(job_id: str) -> str:
    job = Job.fetch(job_id, connection=jobs.get_connection(), serializer=JSONSerializer)
    assert job.get_status() == JobStatus.FAILED
    assert job_id in jobs.get_queue("items-p2").failed_job_registry.get_job_ids()
    result = job.latest_result()
    assert result is not None
    return str(result.exc_string)


def test_jobs_in_rqs_default_pickle_format_are_failed_with_a_clear_reason_and_the_worker_goes_on(
    worker_process,
):
    pickled = Queue("items-p2", connection=jobs.get_connection()).enqueue(
        "tests.jobs.record", key="pickled", value="queue.enqueue"
    )
    cli = subprocess.run(
        [RQ, "enqueue", "--url", redis_url(), "--queue", "items-p2", "--job-id", "from-rq-cli", *ARGS],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    # A hash RQ cannot even load (not a date where one belongs), by some other writer.
    connection = jobs.get_connection()
    connection.hset("rq:job:garbled", mapping={"data": b"x", "created_at": "yesterday", "origin": "items-p2"})
    connection.rpush("rq:queue:items-p2", "garbled")
    jobs.enqueue("tests.jobs.record", queue="items-p2", kwargs={"key": "after", "value": "ran"})

    proc = worker_process("--processes", "1", "--queues", "items-p2")
    wait_for(
        lambda: recorded("after") == ["ran"], timeout=60, what="the product's job after the pickled ones"
    )
    assert proc.popen.poll() is None, proc.output()  # still working
    assert recorded("pickled") == []  # never run
    for job_id in (pickled.id, "from-rq-cli"):
        reason = _failed_reason(job_id)
        assert "RQ's default pickle serializer" in reason, reason
        assert "rq.serializers.JSONSerializer" in reason, reason
    garbled = jobs.get_queue("items-p2").failed_job_registry
    assert "garbled" in garbled.get_job_ids()
    assert b"cannot be read by the product's workers" in connection.hget("rq:job:garbled", "exc_info")
    output = proc.output()
    assert "found an unhandled exception" not in output, output
    assert "cannot be read by the product's workers" in output, output


@pytest.mark.parametrize("mode", [[], ["--burst"]], ids=["long-running", "burst"])
def test_a_worker_that_dies_of_an_error_exits_non_zero(worker_process, mode):
    # Something else holds the queue's key (a string, not a list): RQ's loop ends on the error.
    jobs.get_connection().set("rq:queue:items-p2", "not a list")
    proc = worker_process("--processes", "1", "--queues", "items-p2", *mode)
    assert proc.wait(timeout=180) != 0  # a hang guard: it dies of the error at its first pick
    assert "WRONGTYPE" in proc.output()


# --- stock tools against the product's Redis: they work as documented, or refuse in one line ----


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout
    )


def _manage(*argv: str) -> subprocess.CompletedProcess[str]:
    return _run(sys.executable, str(ROOT / "manage.py"), *argv)


def test_a_stock_rqscheduler_never_crashes_on_the_products_due_cron_entries():
    cron.cron_register()
    scheduled = cron.CrmScheduler.scheduled_jobs_key
    connection = jobs.get_connection()
    connection.zadd(scheduled, {"cron-recover": 0})  # due now
    done = _run(str(Path(sys.executable).with_name("rqscheduler")), "--url", redis_url(), "--burst")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert connection.zscore(scheduled, "cron-recover") == 0  # left to the product's scheduler


@pytest.mark.parametrize("queue_args", [[], ["items-p2"]], ids=["no-queue-name", "a-queue-name"])
def test_manage_py_rqworker_without_serializer_runs_the_products_jobs(queue_args):
    job_id = jobs.enqueue("tests.jobs.record", queue="items-p2", kwargs={"key": "rqworker", "value": "ran"})
    done = _manage("rqworker", "--burst", *queue_args)
    assert done.returncode == 0, done.stderr
    assert recorded("rqworker") == ["ran"]
    fetched = jobs.fetch_job(job_id)
    assert fetched is not None and fetched.get_status() == JobStatus.FINISHED


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["rqenqueue", "tests.jobs.record"], "name a queue with --queue"),
        (["rqscheduler"], "manage.py scheduler"),
        (["rqworker-pool", "--num-workers", "2"], "manage.py workers --processes N"),
    ],
)
def test_django_rq_commands_the_product_does_not_use_refuse_in_one_line(command, words):
    done = _manage(*command)
    assert done.returncode == 1
    assert words in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "KeyError" not in done.stderr


def test_rqsuspend_and_rqresume_act_on_the_products_workers():
    connection = jobs.get_connection()
    assert _manage("rqsuspend").returncode == 0
    assert is_suspended(connection)
    assert _manage("rqresume").returncode == 0
    assert not is_suspended(connection)


def test_rq_info_as_documented_lists_the_products_queues_and_workers(worker_process):
    jobs.enqueue("tests.jobs.record", queue="items-p5", kwargs={"key": "info", "value": "x"})
    proc = worker_process("--processes", "1", "--queues", "runs")
    wait_for(lambda: jobs.get_connection().scard("rq:workers") > 0, timeout=60, what="the worker registered")
    done = _run(str(Path(sys.executable).with_name("rq")), "info", "--url", redis_url(), "runs", "items-p5")
    assert done.returncode == 0, done.stderr
    assert "items-p5" in done.stdout and "1 workers" in done.stdout, done.stdout
    assert proc.popen.poll() is None


def test_rq_dashboard_as_documented_answers_every_page_of_the_products_jobs(run_jobs):
    done_id = jobs.enqueue("tests.jobs.record", queue="items-p2", kwargs={"key": "dash", "value": "x"})
    run_jobs(["items-p2"])  # finished: its JSON result is what a pickle-reading dashboard fails on
    failed_id = jobs.enqueue("tests.jobs.fail", queue="maintenance", kwargs={"key": "dash"})
    run_jobs(["maintenance"])
    queued_id = jobs.enqueue("tests.jobs.record", queue="items-p3", kwargs={"key": "dash", "value": "y"})
    port = free_port()
    argv = ["--redis-url", redis_url(), "--json", "--bind", "127.0.0.1", "--port", str(port)]
    dashboard = subprocess.Popen(
        [str(Path(sys.executable).with_name("rq-dashboard")), *argv],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/0"
    try:
        wait_for(lambda: _status(f"{base}/data/queues.json") == 200, timeout=60, what="rq-dashboard")
        pages = [f"/view/job/{job_id}" for job_id in (done_id, failed_id, queued_id)]
        pages += [f"/data/job/{job_id}.json" for job_id in (done_id, failed_id, queued_id)]
        pages += [
            "/data/jobs/items-p2/finished/8/asc/1.json",
            "/data/jobs/maintenance/failed/8/asc/1.json",
            "/data/jobs/items-p3/queued/8/asc/1.json",
            "/data/workers.json",
        ]
        assert {page: _status(base + page) for page in pages} == dict.fromkeys(pages, 200)
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=30)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0
