"""Workers SIGKILLed in the middle of flows, Redis flushed, PostgreSQL restarted: nobody messaged
twice, none skipped."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from campaigns import lifecycle, recovery
from campaigns.models import WhatsappMessage
from crm import jobs
from crm.embedded import Postgres
from flows import services
from flows.models import Enrollment, EnrollmentStep
from tests.campaigns.test_whatsapp_crash import kill_inside_a_send
from tests.conftest import child_env, wait_for

pytestmark = pytest.mark.slow

FLOW = {
    "key": "crash",
    "name": "Crash",
    "trigger": {"type": "customer_created"},
    "transactional": True,
    "steps": [
        {"type": "wait", "minutes": 0},
        {"type": "send_whatsapp", "template": "boas_vindas", "variables": ["first_name"]},
        {"type": "send_whatsapp", "template": "segunda", "variables": ["first_name"]},
    ],
}
QUEUES = "flows,whatsapp-send"


def pace(number, n: int) -> None:
    """The number paced so that the flow's 2n sends take ~15 s whatever the machine: work is left
    for the second victim, the survivor and after a restart (unpaced, a fast send path had sent
    everything before the first kill's victim was even replaced)."""
    number.messages_per_second = max(1, 2 * n // 15)
    number.save(update_fields=["messages_per_second"])


def _done() -> bool:
    call_command("recover", stdout=StringIO())  # what a dead worker held comes back from PostgreSQL
    return not Enrollment.objects.filter(status="active").exists()


def _all_sent() -> bool:
    call_command("recover", stdout=StringIO())
    return not WhatsappMessage.objects.filter(status="queued").exists()


def test_workers_killed_mid_flow_and_a_redis_flush_message_nobody_twice_and_skip_nobody(
    wa, sandbox, worker_process
):
    n = 300
    customers = wa["customers"](n)
    flow, _ = services.flow_import(data=FLOW, organization_slug=wa["org"].slug)
    sandbox.configure(latency_ms=20)
    pace(wa["number"], n)
    services.enroll(flow=flow, customer_ids=[c.pk for c in customers], entry_keys=["x"] * n)
    # Sends claimed 10 at a time: a job runs a batch of 100 enrollments (and steals more), so with
    # the whole batch claimed at once a victim could have nearly everything in flight when killed,
    # leaving the second victim nothing to be killed in the middle of.
    env = child_env(WHATSAPP_SEND_CHUNK="10")
    victim = worker_process("--queues", QUEUES, "--processes", "2", env=env)
    wait_for(lambda: sandbox.stats()["accepted"] >= 40, timeout=120, what="flow sends to start")
    kill_inside_a_send(victim, sandbox, latency_ms=20)
    # A second victim, then Redis loses everything it held.
    second = worker_process("--queues", QUEUES, env=env)
    accepted = sandbox.stats()["accepted"]
    wait_for(lambda: sandbox.stats()["accepted"] >= accepted + 40, timeout=120, what="more sends")
    second.kill(signal.SIGKILL)
    second.wait(timeout=60)
    jobs.get_connection().flushdb()

    survivor = worker_process("--queues", QUEUES, env=env)
    survivor.wait_ready()  # the SIGTERM below meets a worker, not one still starting
    try:
        wait_for(_done, timeout=600, interval=2, what="every enrollment to finish")
    except BaseException:
        active = list(
            Enrollment.objects.filter(status="active").values_list("pk", "step_index", "due_at")[:5]
        )
        print("ACTIVE", Enrollment.objects.filter(status="active").count(), active, timezone.now())
        conn = jobs.get_connection()
        print("KEYS", sorted(k.decode() for k in conn.keys("*flow*"))[:20])
        print(survivor.output()[-4000:])
        raise
    try:
        wait_for(_all_sent, timeout=300, interval=2, what="every queued message to be sent")
    except BaseException:
        queued = list(WhatsappMessage.objects.filter(status="queued").values_list("campaign_id", "batch")[:5])
        ids = [lifecycle.batch_job_id(c, b) for c, b in queued]
        conn = jobs.get_connection()
        print("QUEUED", queued, [conn.hgetall(f"rq:job:{i}") for i in ids][:2])
        print(survivor.output()[-3000:])
        raise
    survivor.kill(signal.SIGTERM)
    # A hang guard: an idle worker stops at once (a stop request swallowed on its way is
    # remembered, crm.worker; tests/crm/test_worker_processes.py).
    assert survivor.wait(timeout=120) == 0, survivor.output()[-2000:]
    recovery.reconcile_in_flight(older_than_seconds=0)

    assert sandbox.stats()["by_recipient_max"] <= 2  # two steps: at most one message per step each
    each_step_once(sandbox, n)


def each_step_once(sandbox, n: int) -> None:
    """Every one of the `n` customers got each of the flow's two sends once, and none twice."""
    per_step = (
        WhatsappMessage.objects.values("campaign_id", "customer_id").annotate(n=Count("id")).filter(n__gt=1)
    )
    assert not per_step.exists()
    statuses = dict(WhatsappMessage.objects.values_list("status").annotate(n=Count("id")).order_by())
    assert sum(statuses.values()) == 2 * n, statuses  # none skipped: every customer, both steps
    assert set(statuses) <= {"sent", "unknown"}, statuses
    # Meta got each (step, customer) at most once; what we call sent it accepted.
    sent_to = [(m["template"]["name"], m["to"]) for m in sandbox.messages()]
    assert len(sent_to) == len(set(sent_to))
    assert statuses["sent"] <= len(sent_to) <= statuses["sent"] + statuses.get("unknown", 0)
    assert Enrollment.objects.filter(status="completed").count() == n
    assert EnrollmentStep.objects.count() == 3 * n


def postgres_restart(*, outage_seconds: float = 3.0) -> str:
    """PostgreSQL goes away under every client of this test's database and comes back: the server
    itself restarted (`pg_ctl restart`) when this test has an embedded server to itself, else (other
    xdist workers' tests share it) every session of this test's database terminated and new ones
    refused for `outage_seconds` — what the clients see of a restart either way. Returns which."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        data = Path(cursor.fetchone()[0])
    alone = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= 1
    if alone and str(settings.DATABASES["default"]["HOST"]).startswith("/"):
        connection.close()
        server = Postgres(data)
        # -l: the new server's output to its log, not to this pipe (which would then stay open).
        log = str(data / "server.log")
        done = subprocess.run(
            [server.bin("pg_ctl"), "-D", str(data), "-l", log, "-m", "fast", "-w", "-t", "120", "restart"],
            **server.run_as(),
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        wait_for(server.is_ready, timeout=120, what="PostgreSQL to accept connections again")
        return "server restarted"
    db = settings.DATABASES["default"]
    name = db["NAME"]
    connection.close()
    # From the maintenance database: a session cannot shut its own database.
    with psycopg.connect(
        host=db["HOST"],
        port=db.get("PORT") or None,
        user=db["USER"],
        password=db.get("PASSWORD") or None,
        dbname="postgres",
        autocommit=True,
    ) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s", [name]
            )
            time.sleep(outage_seconds)  # the outage itself (nothing is awaited): connections refused
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    return "database sessions terminated"


def test_postgresql_restarted_mid_flow_messages_nobody_twice_and_skips_nobody(wa, sandbox, worker_process):
    n = 150
    customers = wa["customers"](n)
    flow, _ = services.flow_import(data=FLOW, organization_slug=wa["org"].slug)
    sandbox.configure(latency_ms=20)
    pace(wa["number"], n)
    services.enroll(flow=flow, customer_ids=[c.pk for c in customers], entry_keys=["x"] * n)
    workers = worker_process("--queues", QUEUES, "--processes", "2", env=child_env())
    wait_for(lambda: sandbox.stats()["accepted"] >= 40, timeout=120, what="flow sends to start")
    how = postgres_restart()
    accepted = sandbox.stats()["accepted"]

    def _sending_again() -> bool:
        # A job that failed while PostgreSQL was away comes back from the recovery pass (the
        # scheduler's, every minute); the same worker processes, not restarted, run it.
        call_command("recover", stdout=StringIO())
        return sandbox.stats()["accepted"] > accepted

    try:
        wait_for(_sending_again, timeout=300, interval=2, what=f"sends after ({how})")
        wait_for(_done, timeout=600, interval=2, what="every enrollment to finish")
        wait_for(_all_sent, timeout=300, interval=2, what="every queued message to be sent")
    except BaseException:
        print(how, workers.output()[-4000:])
        raise
    workers.kill(signal.SIGTERM)
    workers.wait(timeout=60)
    recovery.reconcile_in_flight(older_than_seconds=0)

    each_step_once(sandbox, n)
