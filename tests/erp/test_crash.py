"""A worker SIGKILLed in the middle of a full customer sync: the retry resumes from the saved
trans_id, and in the end every customer is there exactly once."""

from __future__ import annotations

import signal
import time

import pytest
from django.db.models import Count
from django.utils import timezone

from crm import jobs, queues
from crm.models import Customer, JobRun
from erp import services
from erp.models import ErpConnection
from tests.conftest import child_env, wait_for
from tests.erp.conftest import make_world

pytestmark = pytest.mark.slow

CUSTOMERS = 20_000


def test_a_full_sync_killed_mid_way_resumes_from_its_saved_trans_id(
    sandbox_factory, transactional_db, worker_process
):
    sandbox = sandbox_factory(customers=CUSTOMERS, latency_ms=400)  # slow pages: time to kill it mid-way
    world = make_world(sandbox)
    org, connection = world["org"], world["connection"]
    day = timezone.localdate()
    job_id = services.customers_job_id(organization_id=org.pk, day=day)
    # The queue's policy (3 attempts) with the retry backoff shortened from 60 s for the test.
    jobs.enqueue(
        "erp.tasks.erp_customers_sync",
        queue=queues.ERP_CUSTOMER_SYNC,
        kwargs={"organization_id": org.pk, "full": True, "day": day.isoformat()},
        job_id=job_id,
        backoff=1,
    )
    env = child_env(CRM_HEARTBEAT_INTERVAL="1", CRM_HEARTBEAT_TTL="4", CRM_MAINTENANCE_INTERVAL="1")
    victim = worker_process("--queues", queues.ERP_CUSTOMER_SYNC, env=env)
    customers = Customer.objects.filter(organization=org)
    wait_for(lambda: customers.count() >= 3000, timeout=90, what="a few pages to be synced")
    victim.kill(signal.SIGKILL)
    victim.wait(timeout=60)
    saved = ErpConnection.objects.get(pk=connection.pk).customers_full_cursor
    at_kill = customers.count()
    assert at_kill < CUSTOMERS, "the sync finished before it could be killed; raise the latency"
    # The position and the pages it covers committed together: customer i has trans_id 10 (i + 1).
    assert saved == at_kill * 10 and saved > 0
    assert JobRun.objects.get(kind="erp-customers", key=job_id).status == JobRun.Status.RUNNING

    # Another worker notices the dead one's job and retries it: only after the dead one's heartbeat
    # expired (CRM_HEARTBEAT_TTL, 4 s), long after the sandbox logged a request still on the wire.
    restarted_at = time.time()
    worker_process("--queues", queues.ERP_CUSTOMER_SYNC, env=env)
    wait_for(
        lambda: JobRun.objects.get(key=job_id).status == JobRun.Status.COMPLETED,
        timeout=150,
        interval=0.5,
        what="the retried sync to complete",
    )
    second_run = [r["params"]["trans_id"] for r in sandbox.requests() if r["at"] >= restarted_at]
    assert second_run[0] == str(saved)  # it restarted from the saved trans_id, not from 0
    assert "0" not in second_run
    assert [int(t) for t in second_run] == sorted(int(t) for t in second_run)

    assert customers.count() == CUSTOMERS
    assert not customers.values("erp_id").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert set(customers.values_list("erp_id", flat=True)) == {str(1000 + i) for i in range(CUSTOMERS)}
    run = JobRun.objects.get(key=job_id)
    assert run.attempts == 2
    connection.refresh_from_db()
    assert connection.customers_full_cursor is None and connection.customers_full_synced_at is not None
    assert connection.customers_trans_id == CUSTOMERS * 10
    assert jobs.fetch_job(job_id).get_status() == "finished"
