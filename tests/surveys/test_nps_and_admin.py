"""The NPS report (per store and month, in SQL) and the surveys' admin."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from crm.models import Customer, Membership, Organization, Store
from surveys import selectors
from surveys.models import Survey
from tests.surveys.conftest import Shop

S = Survey.Status
SAO_PAULO = ZoneInfo("America/Sao_Paulo")


def _month_start(months_ago: int) -> datetime:
    now = timezone.now().astimezone(SAO_PAULO)
    index = now.year * 12 + now.month - 1 - months_ago
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=SAO_PAULO)


def _answer(
    shop: Shop, store: Store, score: int, answered_at: datetime, customer: Customer | None = None
) -> Survey:
    survey = Survey.objects.get(sale=shop.sale(customer or shop.ana, store=store))
    Survey.objects.filter(pk=survey.pk).update(
        status=S.ANSWERED, score=score, answered_at=answered_at, sent_at=answered_at
    )
    return survey


@pytest.fixture
def answers(shop: Shop) -> dict:
    """Centro this month: 10, 9, 8, 6, 0 (NPS 0); Shopping this month: 10, 10, 7 (NPS 66.7);
    Centro last month: 3, plus one answered at 00:30 UTC on this month's 1st (still last month in
    São Paulo): 10 (NPS 0). An unanswered survey and another organization's answer count nowhere."""
    this_month = _month_start(0) + timedelta(days=1, hours=12)
    last_month = _month_start(1) + timedelta(days=10)
    for score in (10, 9, 8, 6, 0):
        _answer(shop, shop.centro, score, this_month)
    for score in (10, 10, 7):
        _answer(shop, shop.shopping, score, this_month)
    _answer(shop, shop.centro, 3, last_month)
    _answer(shop, shop.centro, 10, _month_start(0).astimezone(UTC).replace(hour=0, minute=30))
    shop.sale(shop.bruno)  # scheduled, not answered
    return {"this": _month_start(0).date(), "last": _month_start(1).date()}


def test_nps_per_store_and_month_is_promoters_minus_detractors(shop: Shop, answers: dict):
    with CaptureQueriesContext(connection) as queries:
        rows = selectors.nps_by_store_and_month(organization=shop.org)
    assert len(queries) == 1
    assert "GROUP BY" in queries[0]["sql"]

    table = {
        (r.month, r.store_name): (r.responses, r.promoters, r.passives, r.detractors, r.nps) for r in rows
    }
    assert table == {
        (answers["this"], "Centro"): (5, 2, 1, 2, 0.0),
        (answers["this"], "Shopping"): (3, 2, 1, 0, 66.7),
        (answers["last"], "Centro"): (2, 1, 0, 1, 0.0),
    }
    assert [r.month for r in rows] == [answers["this"], answers["this"], answers["last"]]  # newest first

    totals = selectors.nps_month_totals(rows)
    assert (totals[answers["this"]].responses, totals[answers["this"]].nps) == (8, 25.0)  # (4 - 2) / 8
    assert totals[answers["last"]].nps == 0.0


def test_the_report_can_start_at_a_date(shop: Shop, answers: dict):
    rows = selectors.nps_by_store_and_month(organization=shop.org, since=_month_start(0))
    assert {r.month for r in rows} == {answers["this"]}


def test_the_admin_nps_report_renders_for_staff(shop: Shop, answers: dict, admin_client):
    response = admin_client.get(f"/admin/surveys/survey/nps/?organization={shop.org.pk}&months=3")

    assert response.status_code == 200
    html = response.content.decode()
    month = answers["this"].strftime("%Y-%m")
    row = re.search(rf'<tr data-month="{month}" data-store="{shop.shopping.pk}">(.*?)</tr>', html, re.S)
    assert row is not None
    assert re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))[1:] == ["Shopping", "3", "2", "1", "0", "66,7"]
    total = re.search(rf'<tr data-month="{month}" data-store="all".*?data-nps="([^"]+)"', html, re.S)
    assert total is not None and total.group(1) == "25.0"
    assert f'<tr data-month="{answers["last"]:%Y-%m}" data-store="{shop.centro.pk}"' in html


def test_the_nps_report_is_refused_to_non_staff_and_to_staff_without_permission(shop: Shop, client):
    url = f"/admin/surveys/survey/nps/?organization={shop.org.pk}"
    User.objects.create_user("cliente", password="pw-cliente-123")
    client.force_login(User.objects.get(username="cliente"))
    response = client.get(url)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]

    staff = User.objects.create_user("operador", password="pw-operador-123", is_staff=True)
    client.force_login(User.objects.get(username="operador"))
    assert client.get(url).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_survey"))
    assert client.get(url).status_code == 403  # Django's model permissions give a non-member nothing
    Membership.objects.create(user=staff, organization=shop.org, role=Membership.Role.VIEWER)
    assert client.get(url).status_code == 200
    Organization.objects.create(name="Outra", slug="outra")
    assert b"Outra" not in client.get("/admin/surveys/survey/nps/").content


def test_the_survey_changelist_links_the_report_filters_and_searches(shop: Shop, admin_client):
    survey = Survey.objects.get(sale=shop.sale(shop.ana, store=shop.shopping))
    shop.sale(shop.bruno)

    response = admin_client.get("/admin/surveys/survey/")
    assert response.status_code == 200
    assert 'href="/admin/surveys/survey/nps/"' in response.content.decode()

    found = admin_client.get("/admin/surveys/survey/", {"q": survey.sale.erp_id})
    assert list(found.context["cl"].result_list) == [survey]
    by_email = admin_client.get("/admin/surveys/survey/", {"q": "ana@example.com.br"})
    assert list(by_email.context["cl"].result_list) == [survey]
    filtered = admin_client.get(
        "/admin/surveys/survey/", {"store__id__exact": shop.shopping.pk, "status__exact": "scheduled"}
    )
    assert list(filtered.context["cl"].result_list) == [survey]
    assert admin_client.get(f"/admin/surveys/survey/{survey.pk}/change/").status_code == 200


def test_the_changelist_queries_stay_bounded(shop: Shop, admin_client):
    for i in range(30):
        shop.sale(shop.customer(f"Cliente {i}", f"c{i}@example.com.br"))
    with CaptureQueriesContext(connection) as few:
        admin_client.get("/admin/surveys/survey/")
    for i in range(30, 60):
        shop.sale(shop.customer(f"Cliente {i}", f"c{i}@example.com.br"))
    with CaptureQueriesContext(connection) as more:
        admin_client.get("/admin/surveys/survey/")
    assert len(more) == len(few)
