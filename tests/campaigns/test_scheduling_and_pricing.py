"""Scheduled starts (one delayed job per campaign), the admin's live progress, the pricing sync."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from campaigns import lifecycle
from campaigns.models import Campaign
from crm import recovery
from integrations import services as integration_services
from integrations.models import WhatsappPrice


def test_scheduling_puts_one_delayed_job_and_rescheduling_replaces_it(wa, redis_db, run_jobs, english):
    wa["customers"](3)
    campaign = wa["campaign"]()
    at = timezone.now() + timedelta(hours=2)
    lifecycle.campaign_schedule(campaign=campaign, at=at)
    lifecycle.campaign_schedule(campaign=campaign, at=at + timedelta(hours=1))
    assert redis_db.zrange("rq:scheduled:campaign-trigger", 0, -1) == [b"campaign-%d" % campaign.pk]
    score = redis_db.zscore("rq:scheduled:campaign-trigger", f"campaign-{campaign.pk}")
    assert abs(score - (at + timedelta(hours=1)).timestamp()) < 1
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SCHEDULED
    lifecycle.campaign_unschedule(campaign=campaign)
    assert redis_db.zcard("rq:scheduled:campaign-trigger") == 0
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.DRAFT
    with pytest.raises(lifecycle.CampaignError, match="in the past"):
        lifecycle.campaign_schedule(campaign=campaign, at=timezone.now() - timedelta(minutes=1))


def test_the_trigger_starts_the_campaign_once_even_if_it_fires_twice(wa, sandbox, run_jobs):
    from campaigns import tasks

    wa["customers"](4)
    campaign = lifecycle.campaign_schedule(campaign=wa["campaign"](), at=timezone.now() + timedelta(hours=1))
    assert tasks.campaign_trigger(campaign.pk) == Campaign.Status.SENDING
    assert tasks.campaign_trigger(campaign.pk) == Campaign.Status.SENDING  # a second firing changes nothing
    run_jobs()
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT
    assert sandbox.stats()["by_recipient_max"] == 1 and sandbox.stats()["accepted"] == 4


def test_a_scheduled_start_lost_with_redis_is_put_back(wa, redis_db):
    campaign = lifecycle.campaign_schedule(campaign=wa["campaign"](), at=timezone.now() + timedelta(hours=3))
    redis_db.flushdb()
    assert recovery.recover()["campaign-triggers"] == 1
    assert redis_db.zscore("rq:scheduled:campaign-trigger", f"campaign-{campaign.pk}") is not None
    assert recovery.recover()["campaign-triggers"] == 0


@pytest.mark.slow
def test_a_worker_pool_started_after_redis_was_lost_recovers_and_sends(wa, sandbox, redis_db, worker_process):
    from tests.conftest import wait_for

    wa["customers"](3)
    campaign = lifecycle.campaign_schedule(
        campaign=wa["campaign"](), at=timezone.now() + timedelta(seconds=2)
    )
    redis_db.flushdb()  # the delayed start is gone; the database still says "scheduled"
    worker = worker_process("--queues", "campaign-trigger,whatsapp-send")  # long-running: recovers at start
    wait_for(
        lambda: Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT,
        timeout=30,
        what="the recovered scheduled campaign to be sent",
    )
    worker.kill()
    assert sandbox.stats()["accepted"] == 3


def test_the_admin_shows_live_progress_as_json(wa, client, sandbox, run_jobs):
    wa["customers"](5)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    user = get_user_model().objects.create_user(
        "ops", password="x-pw-12345", is_staff=True, is_superuser=True
    )
    client.force_login(user)
    data = client.get(f"/admin/campaigns/campaign/{campaign.pk}/status/").json()
    assert data["status"] == "sent" and data["counts"]["sent"] == 5 and data["progress"] == 1.0
    page = client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/")
    assert page.status_code == 200 and b'id="live-status"' in page.content
    client.logout()
    assert client.get(f"/admin/campaigns/campaign/{campaign.pk}/status/").status_code == 302


@pytest.fixture
def rate_card_server():
    body = {"csv": ""}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            payload = body["csv"].encode()
            self.send_response(200 if payload else 503)
            self.send_header("Content-Type", "text/csv")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/rates.csv", body
    server.shutdown()


def test_the_pricing_sync_upserts_rates_and_skips_bad_rows(db, rate_card_server):
    url, body = rate_card_server
    body["csv"] = (
        "country,category,price,currency\nBR,marketing,0.0625,USD\n*,marketing,0.07,USD\nXX1,utility,1,USD\nBR,utility,abc,USD\n"
    )
    assert integration_services.whatsapp_prices_sync(url=url) == {"rates": 2, "skipped": 2}
    body["csv"] = "country,category,price\nBR,marketing,0.0700\n"
    integration_services.whatsapp_prices_sync(url=url)
    assert WhatsappPrice.objects.get(country="BR", category="marketing").price == Decimal("0.0700")
    assert WhatsappPrice.objects.count() == 2
    body["csv"] = ""
    from integrations.errors import IntegrationError

    with pytest.raises(IntegrationError) as failure:
        integration_services.whatsapp_prices_sync(url=url)
    assert failure.value.retryable and failure.value.status == 503


def test_the_admin_schedules_in_the_organizations_time_zone(wa, redis_db):
    from datetime import UTC, datetime

    from django.test import Client

    from crm.models import Organization

    Organization.objects.filter(pk=wa["org"].pk).update(timezone="America/Manaus")  # UTC-4
    campaign = wa["campaign"]()
    staff = Client()
    staff.force_login(get_user_model().objects.create_user("ops", is_staff=True, is_superuser=True))
    url = f"/admin/campaigns/campaign/{campaign.pk}/change/"
    page = staff.get(url)
    assert "America/Manaus" in page.content.decode()
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and not isinstance(v, list | dict)}
    data.update(
        organization=wa["org"].pk,
        whatsapp_number=wa["number"].pk,
        template_variables='["first_name"]',
        scheduled_at_0="2030-12-01",
        scheduled_at_1="09:00:00",
        email_body_format="mjml",
        recurrence_misfire="once",
    )
    response = staff.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SCHEDULED
    assert campaign.scheduled_at == datetime(2030, 12, 1, 13, 0, tzinfo=UTC)  # 09:00 in Manaus
    score = redis_db.zscore("rq:scheduled:campaign-trigger", f"campaign-{campaign.pk}")
    assert score == campaign.scheduled_at.timestamp()
