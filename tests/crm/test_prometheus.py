"""GET /metrics and what feeds it: job outcomes counted by real workers, the queues, campaigns, ERP
syncs, the runner's breakers and DLQ; and the organization on every job's log line."""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from campaigns import lifecycle
from campaigns.models import CampaignMetric
from crm import jobs, prometheus, stats
from crm.logfmt import JsonFormatter
from crm.models import Organization
from crm.resilience import BreakerPolicy, Gate
from erp import services as erp_services
from project.sandboxes.millennium import MillenniumSandbox
from runner import operator
from runner.models import Execution, ExecutionItem, Handler, IntegrationType
from tests.campaigns import conftest as campaign_world
from tests.conftest import recorded, wait_for
from tests.erp.conftest import make_world

pytestmark = pytest.mark.django_db(transaction=True)

# The WhatsApp world (an organization, a number on the loopback Meta sandbox, a campaign factory).
sandbox = campaign_world.sandbox
wa = campaign_world.wa

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: Client, **meta: Any) -> Samples:
    response = client.get("/metrics", **meta)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture(autouse=True)
def _open_to_loopback(settings) -> None:
    settings.METRICS_TOKEN = ""


def test_a_real_worker_counts_each_outcome_and_duration_per_queue(client, worker_process):
    for i in range(3):
        jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "ok", "value": str(i)})
    jobs.enqueue("tests.jobs.fail", queue="whatsapp-send", kwargs={"key": "bad"})  # 2 attempts, 1 s apart
    jobs.enqueue("tests.jobs.defer_once", queue="runs", kwargs={"key": "later", "seconds": 1})
    jobs.enqueue("tests.jobs.sleep_and_record", queue="runs", kwargs={"key": "slow", "seconds": 0.3})
    assert worker_process("--burst").wait(timeout=120) == 0
    assert recorded("bad") == ["attempt", "attempt"] and recorded("later") == ["run", "run"]

    samples = scrape(client)  # this process never ran a job: the counts come from Redis
    jobs_total = {
        (dict(labels)["queue"], dict(labels)["outcome"]): v
        for (name, labels), v in samples.items()
        if name == "crm_jobs_total" and v
    }
    assert jobs_total == {
        ("email-send", "succeeded"): 3,
        ("whatsapp-send", "retry-scheduled"): 1,
        ("whatsapp-send", "failed"): 1,
        ("runs", "deferred"): 1,
        ("runs", "succeeded"): 2,
    }
    # Every known outcome is shown, at 0 when nothing happened.
    assert value(samples, "crm_jobs_total", queue="maintenance", outcome="failed") == 0

    assert value(samples, "crm_job_duration_seconds_count", queue="runs") == 3
    assert value(samples, "crm_job_duration_seconds_count", queue="email-send") == 3
    assert value(samples, "crm_job_duration_seconds_sum", queue="runs") >= 0.3
    runs = [
        value(samples, "crm_job_duration_seconds_bucket", queue="runs", le=le)
        for le in prometheus._BUCKET_LABELS
    ]
    assert runs == sorted(runs), "buckets are cumulative"
    assert runs[-1] == 3
    # The 0.3 s job is above the 0.25 s bucket (the two quick runs usually are not, but a loaded
    # machine can make any run slow).
    assert value(samples, "crm_job_duration_seconds_bucket", queue="runs", le="0.25") <= 2
    assert value(samples, "crm_job_duration_seconds_bucket", queue="maintenance", le="+Inf") == 0


def test_a_job_still_finishes_when_its_metrics_cannot_be_written(run_jobs, redis_db, caplog):
    redis_db.set(prometheus.JOBS_KEY, "not a hash")  # every HINCRBY on it now fails (WRONGTYPE)
    job_id = jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "m", "value": "1"})
    with caplog.at_level(logging.DEBUG, logger="crm.jobs"):
        run_jobs()
    assert recorded("m") == ["1"]
    assert jobs.fetch_job(job_id).get_status() == "finished"
    assert any(r.getMessage().startswith("job metrics not recorded") for r in caplog.records)
    line = next(r for r in caplog.records if getattr(r, "job_id", None) == job_id)
    assert line.outcome == "succeeded"


def test_queue_gauges_agree_with_queue_stats_and_live_workers_are_counted(client, worker_process, run_jobs):
    jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "q", "value": "done"})
    run_jobs()
    for i in range(2):
        jobs.enqueue("tests.jobs.record", queue="email-send", kwargs={"key": "q", "value": str(i)})
    jobs.enqueue("tests.jobs.record", queue="post-sale-survey", kwargs={"key": "q", "value": "d"}, delay=3600)
    time.sleep(0.2)

    samples = scrape(client)
    expected = stats.queue_stats()
    for queue, counts in expected.items():
        for state, n in counts.items():
            assert value(samples, "crm_queue_jobs", queue=queue, state=state) == n, (queue, state)
    assert value(samples, "crm_queue_jobs", queue="email-send", state="waiting") == 2
    assert value(samples, "crm_queue_jobs", queue="email-send", state="completed") == 1
    assert value(samples, "crm_queue_jobs", queue="post-sale-survey", state="delayed") == 1
    assert 0.2 <= value(samples, "crm_oldest_waiting_seconds", queue="email-send") < 60
    assert value(samples, "crm_oldest_waiting_seconds", queue="runs") == 0
    assert value(samples, "crm_workers") == 0

    # A long-running worker on a queue with nothing to do: alive, and the waiting jobs stay waiting.
    worker_process("--queues", "maintenance")
    wait_for(lambda: value(scrape(client), "crm_workers") == 1, timeout=60, what="the worker to register")
    assert value(scrape(client), "crm_queue_jobs", queue="email-send", state="waiting") == 2


def test_the_apps_families_follow_the_platforms_in_registration_order(client):
    """crm imports no app: campaigns, the ERP and the runner register theirs, and /metrics reads
    as it did when crm/prometheus.py collected them itself."""
    response = client.get("/metrics")
    families = [(f.name, f.type) for f in text_string_to_metric_families(response.content.decode())]
    assert families == [
        ("crm_queue_jobs", "gauge"),
        ("crm_queue_tenant_waiting", "gauge"),
        ("crm_queue_tenants_ready", "gauge"),
        ("crm_jobs", "counter"),
        ("crm_job_duration_seconds", "histogram"),
        ("crm_erp_sync_rows", "counter"),
        ("crm_workers", "gauge"),
        ("crm_oldest_waiting_seconds", "gauge"),
        ("crm_chatwoot_waiting", "gauge"),
        ("crm_chatwoot_mirror_waiting", "gauge"),
        ("crm_messages", "gauge"),
        ("crm_circuit_state", "gauge"),
        ("crm_runner_dlq_items", "gauge"),
    ]
    with pytest.raises(ValueError, match="unknown counter"):
        prometheus.count("not_registered")


def test_a_token_is_required_once_set_and_compared_whole(client, settings):
    settings.METRICS_TOKEN = "metrics-token-0123456789abcdef"
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"].startswith("Bearer")
    assert b"crm_" not in refused.content
    assert (
        client.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-token-0123456789abcde").status_code == 401
    )
    assert (
        client.get("/metrics", HTTP_AUTHORIZATION="Basic metrics-token-0123456789abcdef").status_code == 401
    )
    # Set, the token is asked of loopback too.
    samples = scrape(client, HTTP_AUTHORIZATION="Bearer metrics-token-0123456789abcdef")
    assert ("crm_workers", ()) in samples
    assert scrape(
        client, HTTP_AUTHORIZATION="bearer metrics-token-0123456789abcdef", REMOTE_ADDR="203.0.113.9"
    )


def test_without_a_token_only_direct_loopback_requests_are_served(client):
    assert ("crm_workers", ()) in scrape(client)  # the test client comes from 127.0.0.1
    assert ("crm_workers", ()) in scrape(client, REMOTE_ADDR="::1")
    assert client.get("/metrics", REMOTE_ADDR="10.0.0.7").status_code == 403
    # A proxy on the same machine relays outside requests from loopback: not local.
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="198.51.100.4").status_code == 403
    assert client.post("/metrics").status_code == 405


def test_circuit_states_come_from_the_runner_breakers(client, redis_db):
    for key in ("erp-a", "crm-b", "shop-c"):
        IntegrationType.objects.create(integration_key=key, name=key)
    gate = Gate(redis_db)

    def fail_twice(key: str, policy: BreakerPolicy) -> str:
        state = ""
        for _ in range(2):
            admission = gate.admit(
                integration_key=key,
                handler_id=1,
                organization_id=1,
                tenant_limit=1000,
                concurrency=5,
                policy=policy,
            )
            assert admission.admitted
            state = gate.finish(
                admission, integration_key=key, handler_id=1, outcome="failure", policy=policy
            )
        return state

    assert fail_twice("erp-a", BreakerPolicy(failures=2, open_ms=60_000)) == "open"
    assert fail_twice("crm-b", BreakerPolicy(failures=2, open_ms=1)) == "open"
    time.sleep(0.05)  # crm-b's open time is over: its next admission is a probe

    samples = scrape(client)
    assert value(samples, "crm_circuit_state", integration="erp-a") == 2
    assert value(samples, "crm_circuit_state", integration="crm-b") == 1
    assert value(samples, "crm_circuit_state", integration="shop-c") == 0  # never failed
    assert gate.breaker_state("erp-a")["state"] == "open"  # reading changed nothing

    gate.breaker_reset("erp-a")
    assert value(scrape(client), "crm_circuit_state", integration="erp-a") == 0


def test_dlq_items_are_counted_until_replayed(client):
    org = Organization.objects.create(name="Loja DLQ", slug="dlq")
    integration = IntegrationType.objects.create(integration_key="erp-x", name="ERP X")
    handler = Handler.objects.create(
        integration=integration,
        handler_key="orders",
        direction="inbound",
        kind=Handler.Kind.PYTHON,
        callable_path="tests.runner.handlers",
        organization=org,
    )
    execution = Execution.objects.create(
        organization=org,
        integration=integration,
        handler=handler,
        direction="inbound",
        trigger="manual",
        status="completed",
        items_total=4,
        items_succeeded=1,
        items_failed=3,
        items_remaining=0,
    )
    now = timezone.now()
    failed = ExecutionItem.objects.bulk_create(
        ExecutionItem(execution=execution, external_id=f"f{i}", status="failed", dlq_at=now) for i in range(3)
    )
    ExecutionItem.objects.create(execution=execution, external_id="ok", status="succeeded", finished_at=now)
    assert value(scrape(client), "crm_runner_dlq_items") == 3
    assert operator.items_replay(item_ids=[failed[0].pk]) == 1
    assert value(scrape(client), "crm_runner_dlq_items") == 2


def test_an_erp_customer_sync_counts_its_rows(client):
    with MillenniumSandbox(customers=250) as erp:
        world = make_world(erp, page_size=100)
        result = erp_services.customers_sync(connection=world["connection"], full=True)
    assert result.upserted == 250 and result.pages == 3
    samples = scrape(client)
    assert value(samples, "crm_erp_sync_rows_total", kind="customers") == 250
    assert value(samples, "crm_erp_sync_rows_total", kind="sales") == 0


def test_a_campaign_batch_job_logs_its_organization(wa, run_jobs, caplog):
    wa["customers"](3)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    with caplog.at_level(logging.INFO, logger="crm.jobs"):
        run_jobs()
    org_id = wa["org"].pk
    batch_id = lifecycle.batch_job_id(campaign.pk, 0)
    assert jobs.fetch_job(batch_id).meta["organization_id"] == org_id  # carried in meta, not kwargs
    line = next(r for r in caplog.records if r.name == "crm.jobs" and r.job_id == batch_id)
    assert line.outcome == "succeeded" and line.func == "campaigns.tasks.whatsapp_send_batch"
    assert line.organization_id == org_id
    assert f"queue=whatsapp-send id={batch_id} org={org_id} " in line.getMessage()
    as_json = json.loads(JsonFormatter().format(line))
    assert as_json["organization_id"] == org_id and as_json["job_id"] == batch_id


def test_the_messages_gauge_sums_the_campaign_counters_by_channel(wa, run_jobs, client):
    wa["customers"](4)
    wa["customers"](1, start=10, name="")  # an empty template variable: skipped, never sent
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    metric = CampaignMetric.objects.get(campaign=campaign)
    assert (metric.sent, metric.skipped) == (4, 1)
    samples = scrape(client)
    assert value(samples, "crm_messages", channel="whatsapp", status="sent") == 4
    assert value(samples, "crm_messages", channel="whatsapp", status="skipped") == 1
    assert value(samples, "crm_messages", channel="whatsapp", status="failed") == 0
    assert not [k for k in samples if k[0] == "crm_messages" and dict(k[1])["channel"] == "email"]
    assert "# TYPE crm_messages gauge" in client.get("/metrics").content.decode()


def test_a_rescheduled_campaign_start_carries_its_organization(wa):
    campaign = wa["campaign"]()
    lifecycle.campaign_schedule(campaign=campaign, at=timezone.now() + timedelta(hours=1))
    job = jobs.fetch_job(lifecycle.trigger_job_id(campaign.pk))
    assert job is not None and job.meta["organization_id"] == wa["org"].pk
