"""What operators and their scripts use: /admin/metrics, queue_stats, /healthz, the RQ dashboard,
the cron table, the demo data and the admin pages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime
from io import StringIO
from zoneinfo import ZoneInfo

import phonenumbers
import pytest
import redis
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from rq.registry import FailedJobRegistry, FinishedJobRegistry, ScheduledJobRegistry

from crm import cron, jobs, queues, stats
from crm.models import ConsentChange, Customer, JobRun, Organization, Sale, Store
from tests.conftest import ROOT, child_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def staff_client(client):
    user = get_user_model().objects.create_user(
        "ops", password="pw-ops-123", is_staff=True, is_superuser=True
    )
    client.force_login(user)
    return client


@pytest.fixture
def plain_client(client):
    user = get_user_model().objects.create_user("seller", password="pw-seller-123", is_staff=False)
    client.force_login(user)
    return client


def _populate(run_jobs):
    for i in range(3):
        jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "s", "value": str(i)})
    jobs.enqueue("tests.jobs.fail", queue="runs", kwargs={"key": "s-fail"}, attempts=1)
    run_jobs()
    jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "s", "value": "w"})
    jobs.enqueue("tests.jobs.record", queue="post-sale-survey", kwargs={"key": "s", "value": "d"}, delay=3600)


def test_metrics_have_the_seeds_shape_and_agree_with_rq(staff_client, run_jobs):
    _populate(run_jobs)
    response = staff_client.get("/admin/metrics")
    assert response.status_code == 200
    data = response.json()
    assert list(data) == list(queues.QUEUE_NAMES)
    assert all(
        set(counts) == {"waiting", "active", "failed", "completed", "delayed"} for counts in data.values()
    )
    email, runs, survey = (
        jobs.get_queue("email-send"),
        jobs.get_queue("runs"),
        jobs.get_queue("post-sale-survey"),
    )
    assert data["email-send"] == {
        "waiting": 1,
        "active": 0,
        "failed": 0,
        "delayed": 0,
        "completed": FinishedJobRegistry(queue=email).count,
    }
    assert data["email-send"]["completed"] == 3
    assert data["runs"]["failed"] == FailedJobRegistry(queue=runs).count == 1
    assert data["post-sale-survey"]["delayed"] == ScheduledJobRegistry(queue=survey).count == 1


def test_queue_stats_prints_the_same_counts(run_jobs, english):
    _populate(run_jobs)
    out = StringIO()
    call_command("queue_stats", "--json", stdout=out)
    printed = json.loads(out.getvalue())
    # The same counts, and each fair queue's tenants under the new key `tenants`.
    assert {
        q: {k: v for k, v in c.items() if k != "tenants"} for q, c in printed.items()
    } == stats.queue_stats()
    assert printed["erp-sync-queue"].keys() == set(stats.STATES)
    assert set(printed["email-send"]["tenants"]) == {"ready", "tenants", "other_waiting"}
    out = StringIO()
    call_command("queue_stats", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["queue", "waiting", "active", "failed", "completed", "delayed"]
    email_line = next(line for line in lines if line.startswith("email-send"))
    assert email_line.split() == ["email-send", "1", "0", "0", "3", "0"]


@pytest.mark.parametrize("path", ["/admin/metrics", "/admin/rq/", "/admin/rq/queues/0/"])
def test_queue_pages_are_refused_to_anyone_but_staff(client, plain_client, path):
    anonymous = client.__class__().get(path)
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    seller = plain_client.get(path)
    assert seller.status_code == 302 and "/admin/login/" in seller["Location"]


def test_the_rq_dashboard_is_there_for_staff(staff_client):
    response = staff_client.get("/admin/rq/")
    assert response.status_code == 200
    assert b"erp-customer-sync-queue" in response.content


def test_health_reports_database_and_redis(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"]


def test_health_reports_workers_scheduler_and_the_oldest_waiting_job(client, worker_process, redis_db):
    from tests.conftest import wait_for

    jobs.enqueue("tests.jobs.record", queue="maintenance", kwargs={"key": "h", "value": "1"})
    body = client.get("/healthz").json()
    assert body["checks"]["workers"] == {"ok": False, "alive": 0}
    assert body["checks"]["scheduler"]["ok"] is False
    assert body["checks"]["oldest_waiting_seconds"]["by_queue"]["maintenance"] >= 0
    assert client.get("/healthz").status_code == 200  # the web node itself is fine
    assert client.get("/healthz?full=1").status_code == 503  # the platform is not: nobody works
    worker_process("--queues", "maintenance")
    wait_for(lambda: client.get("/healthz").json()["checks"]["workers"]["alive"] == 1, timeout=30)
    # The worker took it (alive comes first: on a busy machine its first dequeue may follow).
    wait_for(
        lambda: client.get("/healthz").json()["checks"]["oldest_waiting_seconds"]["max"] == 0.0, timeout=60
    )
    scheduler = cron.get_scheduler()
    scheduler.register_birth()
    assert client.get("/healthz?full=1").status_code == 200
    scheduler.register_death()
    assert client.get("/healthz?full=1").status_code == 503


def test_health_says_which_dependency_is_down(staff_client, monkeypatch):
    client = Client()  # anonymous: a load balancer, a monitor, anyone
    # A real client to a port where nothing listens.
    monkeypatch.setattr(
        jobs, "get_connection", lambda: redis.Redis(host="127.0.0.9", port=1, socket_connect_timeout=0.5)
    )
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["redis"] == {"ok": False}  # anyone learns which check failed ...
    assert "127.0.0.9" not in response.content.decode()  # ... never where it lives
    detail = staff_client.get("/healthz").json()["checks"]["redis"]
    assert "ConnectionError" in detail["error"] and "127.0.0.9" in detail["error"]


def test_the_cron_table_registers_idempotently(redis_db):
    scheduler = cron.get_scheduler()
    table = cron.cron_table()
    assert {"recover", "whatsapp-reconcile", "whatsapp-pricing-sync"} <= set(table)
    assert cron.cron_register(scheduler) == dict.fromkeys(table, "added")
    assert cron.cron_register(scheduler) == dict.fromkeys(table, "kept")
    assert redis_db.zcard(cron.CrmScheduler.scheduled_jobs_key) == len(table)
    # An entry that left the table is removed; a stranger's scheduled job is not touched.
    scheduler.cron("0 0 * * *", func="crm.tasks.noop", id="cron-retired", queue_name="maintenance")
    scheduler.cron("0 0 * * *", func="crm.tasks.noop", id="someone-else", queue_name="maintenance")
    assert cron.cron_register(scheduler) == {**dict.fromkeys(table, "kept"), "retired": "removed"}
    assert {j.id for j in scheduler.get_jobs()} == {f"cron-{name}" for name in table} | {"someone-else"}
    # After a Redis flush the scheduler puts the table back.
    redis_db.flushdb()
    assert cron.cron_register(scheduler) == dict.fromkeys(table, "added")


def test_cron_times_are_in_the_configured_time_zone():
    entry = cron.CronEntry(
        name="sales-nightly", cron="0 6 * * *", func="crm.tasks.noop", queue="erp-sync-queue"
    )
    sp = ZoneInfo("America/Sao_Paulo")
    after = datetime(2026, 11, 29, 7, 0, tzinfo=sp)
    (nxt,) = entry.next_runs(after=after)
    assert nxt == datetime(2026, 11, 30, 6, 0, tzinfo=sp)
    assert nxt.utcoffset().total_seconds() == -3 * 3600
    with pytest.raises(ValueError, match="not a valid cron"):
        cron.CronEntry(name="bad", cron="61 * * * *", func="crm.tasks.noop", queue="maintenance")


def test_registered_cron_entries_fire_at_local_time(redis_db):
    nightly = cron.CronEntry(
        name="sales-nightly", cron="0 6 * * *", func="crm.tasks.noop", queue="erp-sync-queue"
    )
    cron.cron_register(table={"sales-nightly": nightly})
    score = redis_db.zscore(cron.CrmScheduler.scheduled_jobs_key, "cron-sales-nightly")
    fires_at = datetime.fromtimestamp(score, ZoneInfo("America/Sao_Paulo"))
    assert (fires_at.hour, fires_at.minute) == (6, 0)
    assert fires_at == nightly.next_runs()[0]
    (row,) = [r for r in cron.cron_schedule() if r["name"] == "recover"] or [None]
    assert row is not None and row["next_run"] is None  # the real table is not registered here


def test_the_scheduler_fires_a_due_entry_once_through_the_enqueue_function(redis_db, run_jobs):
    scheduler = cron.get_scheduler()
    cron.cron_register(scheduler)
    # Make the entry due now, then run the scheduler twice (two instances / a restart).
    redis_db.zadd(cron.CrmScheduler.scheduled_jobs_key, {"cron-recover": 0})
    scheduler.run(burst=True)
    cron.get_scheduler().run(burst=True)
    assert redis_db.llen("rq:queue:maintenance") == 1  # cron_fire, once
    run_jobs(["maintenance"])
    fired = [k.decode().removeprefix("rq:job:") for k in redis_db.keys("rq:job:recover-cron-*")]
    assert len(fired) == 1
    assert jobs.fetch_job(fired[0]).get_status() == "finished"
    # ... and it is scheduled again for its next occurrence.
    assert redis_db.zscore(cron.CrmScheduler.scheduled_jobs_key, "cron-recover") > 0


def test_run_now_enqueues_an_entry_at_once(run_jobs, english):
    out = StringIO()
    call_command("cron", "run", "recover", stdout=out)
    assert out.getvalue().startswith("enqueued recover-manual-")
    run_jobs(["maintenance"])
    assert JobRun.objects.count() == 0  # recovery ran, found nothing


def test_demo_is_idempotent_and_its_phones_are_valid_brazilian_mobiles():
    call_command("demo", customers=40, stdout=StringIO())
    call_command("demo", customers=40, stdout=StringIO())
    org = Organization.objects.get(slug="demo")
    assert org.stores.count() == 3
    assert org.customers.count() == 40
    for phone in org.customers.values_list("phone", flat=True):
        parsed = phonenumbers.parse(phone)
        assert phonenumbers.is_valid_number(parsed)
        assert phonenumbers.number_type(parsed) == phonenumbers.PhoneNumberType.MOBILE
        assert phonenumbers.region_code_for_number(parsed) == "BR"
    assert org.customers.filter(email__endswith="@example.com.br").count() == 40
    # Consenting through the ERP path, with its source and one history row each (not twice).
    assert org.customers.filter(marketing_consent=True, marketing_consent_source="erp").count() == 40
    assert ConsentChange.objects.filter(customer__organization=org, given=True, source="erp").count() == 40


@pytest.mark.parametrize(
    "model",
    [Organization, Store, Customer, Sale, JobRun],
)
def test_admin_lists_answer_with_a_bounded_number_of_queries(
    model, staff_client, django_assert_max_num_queries, world
):
    from decimal import Decimal

    from django.utils import timezone

    org, store = world["org"], world["store"]
    for i in range(30):
        c = Customer.objects.create(organization=org, erp_id=f"X{i}", name=f"Cliente {i}")
        Sale.objects.create(
            organization=org,
            store=store,
            customer=c,
            erp_id=f"S{i}",
            total=Decimal("10.50"),
            sold_at=timezone.now(),
        )
        JobRun.objects.create(kind="sync", key=f"k{i}", organization=org)
    url = f"/admin/crm/{model._meta.model_name}/"
    with django_assert_max_num_queries(12):
        response = staff_client.get(url)
    assert response.status_code == 200
    with django_assert_max_num_queries(12):
        response = staff_client.get(url, {"q": "Cliente 1"})
    assert response.status_code == 200


def test_the_schedules_page_lists_every_entry_and_runs_one_now(staff_client, redis_db):
    from django.test import Client

    from crm import cron

    plain_client = Client()
    plain_client.force_login(get_user_model().objects.create_user("seller", password="pw-seller-123"))

    cron.cron_register()
    page = staff_client.get("/admin/schedules/")
    assert page.status_code == 200
    html = page.content.decode()
    for name, entry in cron.cron_table().items():
        assert f'data-name="{name}"' in html and entry.cron in html
    assert "(not registered)" not in html  # registered above: the scheduler's own next run is shown

    response = staff_client.post("/admin/schedules/", {"name": "whatsapp-reconcile"})
    assert response.status_code == 302
    queued = jobs.get_queue("maintenance").get_job_ids()
    assert any(j.startswith("whatsapp-reconcile-manual-") for j in queued), queued
    assert staff_client.post("/admin/schedules/", {"name": "nope"}).status_code == 302
    assert plain_client.get("/admin/schedules/").status_code == 302  # to the login page
    assert plain_client.post("/admin/schedules/", {"name": "recover"}).status_code == 302
    assert not any(j.startswith("recover-manual-") for j in jobs.get_queue("maintenance").get_job_ids())


@pytest.mark.slow
def test_workers_and_schedulers_register_again_after_redis_loses_its_data(client, worker_process, redis_db):
    """Redis restarted empty (or flushed): the running worker and scheduler register again, so
    /healthz?full=1 is right again within a minute instead of 503 until they restart."""
    worker_process()
    scheduler = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "scheduler", "--interval", "1"],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: client.get("/healthz?full=1").status_code == 200, timeout=60, what="a healthy platform"
        )
        redis_db.flushdb()
        # The scheduler loops every second: by the time /healthz is asked it may be back already (a
        # busy CI saw it), so the flush is not asserted through it; both must come back.
        wait_for(
            lambda: client.get("/healthz?full=1").status_code == 200,
            timeout=60,
            interval=0.5,
            what="the worker and the scheduler to register again",
        )
        checks = client.get("/healthz?full=1").json()["checks"]
        assert (checks["workers"]["alive"], checks["scheduler"]["alive"]) == (1, 1)
        # The cron table came back with the scheduler (the recovery pass fires from it).
        wait_for(lambda: redis_db.zcard(cron.CrmScheduler.scheduled_jobs_key) > 0, timeout=90, interval=0.5)
    finally:
        os.killpg(scheduler.pid, signal.SIGKILL)
        scheduler.wait(timeout=10)
