"""A manager runs the sales sync of today and a segment snapshot from the admin (no terminal), through
the same jobs the schedules enqueue, on a burst worker against the ERP stand-in."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from crm import queues
from crm.models import JobRun, Membership, Organization, Sale


def _manager(org) -> Client:
    user = get_user_model().objects.create_user("gerente", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=user, organization=org, role=Membership.Role.MANAGER)
    client = Client(HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(user)
    return client


def test_a_manager_syncs_todays_sales_and_takes_a_segment_snapshot_from_the_admin(erp, run_jobs):
    client = _manager(erp["org"])
    answer = client.post(
        "/admin/erp/erpconnection/",
        {"action": "sync_sales_today", "_selected_action": [erp["connection"].pk]},
        follow=True,
    )
    assert f"enqueued for {len(erp['stores'])} store(s)" in answer.content.decode()
    run_jobs([queues.ERP_SYNC])
    assert JobRun.objects.filter(kind="erp-sales", organization=erp["org"]).count() == len(erp["stores"])
    erp["connection"].refresh_from_db()
    assert erp["connection"].sales_synced_at is not None and not erp["connection"].last_error
    # Whatever today's hour (the stand-in sells from 09:00 to 21:00), nothing from the future is kept.
    assert not Sale.objects.filter(organization=erp["org"], sold_at__gt=timezone.now()).exists()

    page = client.get("/admin/campaigns/customersegment/overview/").content.decode()
    assert 'id="segments-snapshot"' in page
    done = client.post(
        "/admin/campaigns/customersegment/snapshot/", {"organization": erp["org"].pk}, follow=True
    )
    assert "Segment snapshot of" in done.content.decode()
    run_jobs([queues.ERP_SYNC])
    # The snapshot of the last complete day (yesterday: today's sales count from tomorrow's) ran.
    run = JobRun.objects.get(kind="segments-snapshot", organization=erp["org"])
    assert run.status == JobRun.Status.COMPLETED


def test_a_snapshot_of_another_organization_is_refused(erp):
    other = Organization.objects.create(name="Outra", slug="outra")
    client = _manager(erp["org"])
    refused = client.post("/admin/campaigns/customersegment/snapshot/", {"organization": other.pk})
    assert refused.status_code == 403
