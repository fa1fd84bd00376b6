"""A member of one organization is not shown the organization on every row of a list (the room goes to
the columns that differ); a member of two, and an operator, still see which row is whose."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from crm.models import JobRun, Membership, Organization, Sale, Store

pytestmark = pytest.mark.django_db


def _list(client, user) -> str:
    client.force_login(user)
    page = client.get("/admin/crm/sale/")
    assert page.status_code == 200
    return page.content.decode()


def test_the_organization_column_shows_only_when_rows_can_be_of_several_organizations(client):
    a = Organization.objects.create(name="Loja A", slug="loja-a")
    b = Organization.objects.create(name="Loja B", slug="loja-b")
    store = Store.objects.create(organization=a, erp_code="001", name="Centro")
    Sale.objects.create(organization=a, store=store, erp_id="V-1", total="10.00", sold_at="2026-12-01T12:00Z")
    users = get_user_model().objects
    one = users.create_user("uma", password="pw-uma-12345", is_staff=True)
    Membership.objects.create(user=one, organization=a, role="manager")
    two = users.create_user("duas", password="pw-duas-12345", is_staff=True)
    Membership.objects.create(user=two, organization=a, role="manager")
    Membership.objects.create(user=two, organization=b, role="viewer")
    operator = users.create_superuser("op", password="pw-op-1234567")

    page = _list(client, one)
    assert "V-1" in page and "column-organization" not in page and "column-store" in page
    for user in (two, operator):
        page = _list(client, user)
        assert "V-1" in page and "column-organization" in page


def test_a_job_run_s_duration_is_written_as_a_person_reads_it(client):
    from datetime import UTC, datetime, timedelta

    org = Organization.objects.create(name="Loja A", slug="loja-a")
    began = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    for key, took in (("quick", timedelta(microseconds=198_396)), ("slow", timedelta(minutes=3, seconds=5))):
        JobRun.objects.create(
            organization=org,
            kind="erp-sales",
            key=key,
            status="completed",
            started_at=began,
            finished_at=began + took,
        )
    user = get_user_model().objects.create_user("uma", password="pw-uma-12345", is_staff=True)
    Membership.objects.create(user=user, organization=org, role="manager")
    client.force_login(user)
    page = client.get("/admin/crm/jobrun/", HTTP_ACCEPT_LANGUAGE="pt-br").content.decode()
    assert "0,2 s" in page and "3 min 05 s" in page and "0:00:00" not in page
    assert "Duração" in page and "04/12/2026 09:00" in page  # the organization's time, day first


def test_a_job_run_s_page_shows_its_error_once_to_a_member(client):
    from datetime import UTC, datetime

    org = Organization.objects.create(name="Loja A", slug="loja-a")
    run = JobRun.objects.create(
        organization=org,
        kind="erp-sales",
        key="k",
        status="failed",
        started_at=datetime(2026, 12, 4, 12, 0, tzinfo=UTC),
        error='Traceback (most recent call last):\n  File "/srv/x.py"\nValueError: o ERP respondeu 503',
    )
    user = get_user_model().objects.create_user("uma", password="pw-uma-12345", is_staff=True)
    Membership.objects.create(user=user, organization=org, role="manager")
    client.force_login(user)
    page = client.get(f"/admin/crm/jobrun/{run.pk}/change/").content.decode()
    assert page.count("field-error_reason") == 1 and "o ERP respondeu 503" in page and "/srv/x.py" not in page
