"""Scheduling: one survey per sale, due N days after it, created in bulk; dispatch enqueues each once."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from crm import cron, fairshare, jobs, queues, recovery
from crm.models import Organization, Sale, Store
from surveys import services
from surveys.models import Survey
from tests.surveys.conftest import Shop

S = Survey.Status


def _queued_job_ids() -> list[str]:
    return fairshare.queued_ids(jobs.get_connection(), queues.POST_SALE_SURVEY)


def test_a_sale_created_with_the_orm_schedules_one_survey_due_n_days_later(shop: Shop):
    sold_at = timezone.now() - timedelta(hours=2)

    sale = shop.sale(shop.ana, store=shop.shopping, sold_at=sold_at)

    [survey] = Survey.objects.all()
    assert survey.sale_id == sale.pk
    assert (survey.customer_id, survey.store_id, survey.organization_id) == (
        shop.ana.pk,
        shop.shopping.pk,
        shop.org.pk,
    )
    assert survey.channel == Survey.Channel.EMAIL
    assert survey.status == S.SCHEDULED
    assert survey.due_at == sold_at + timedelta(days=3)
    assert survey.token and len(survey.token) >= 20
    # saving the sale again (an edit) schedules nothing more
    sale.total = Decimal("10.00")
    sale.save()
    assert Survey.objects.count() == 1


def test_a_sale_added_in_the_admin_add_form_schedules_one_survey(shop: Shop, admin_client):
    response = admin_client.post(
        "/admin/crm/sale/add/",
        {
            "organization": shop.org.pk,
            "store": shop.centro.pk,
            "customer": shop.bruno.pk,
            "erp_id": "ADMIN-1",
            "total": "350.00",
            "sold_at_0": "2030-03-10",
            "sold_at_1": "15:30:00",
        },
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    sale = Sale.objects.get(erp_id="ADMIN-1")
    survey = Survey.objects.get()
    assert survey.sale_id == sale.pk and survey.customer_id == shop.bruno.pk
    assert survey.due_at == sale.sold_at + timedelta(days=3)
    assert timezone.localtime(survey.due_at).strftime("%Y-%m-%d %H:%M") == "2030-03-13 15:30"


def test_no_survey_without_a_customer_with_surveys_off_or_for_a_long_forgotten_sale(shop: Shop):
    shop.sale(None)
    shop.sale(shop.ana, sold_at=timezone.now() - timedelta(days=60))  # would have been due 57 days ago
    other = Organization.objects.create(name="Sem Pesquisa", slug="sem-pesquisa")  # survey_channel off
    store = Store.objects.create(organization=other, erp_code="9", name="Única")
    Sale.objects.create(
        organization=other,
        store=store,
        customer=shop.customer("Outro"),
        erp_id="X1",
        total=Decimal("1"),
        sold_at=timezone.now(),
    )

    assert Survey.objects.count() == 0


def test_surveys_schedule_run_twice_creates_each_survey_once(shop: Shop):
    sales = [shop.sale(c) for c in (shop.ana, shop.bruno)]
    assert Survey.objects.count() == 2  # by the signal

    assert services.surveys_schedule(sale_ids=[s.pk for s in sales]) == 0
    assert services.surveys_schedule(sale_ids=[s.pk for s in sales] * 2) == 0
    assert Survey.objects.count() == 2


def test_scheduling_2000_sales_at_once_takes_a_few_queries_and_creates_each_once(shop: Shop):
    customers = [shop.customer(f"Cliente {i}", f"c{i}@example.com.br") for i in range(20)]
    now = timezone.now()
    # Bulk inserts, as the ERP sync does: no post_save, so nothing is scheduled yet.
    sales = Sale.objects.bulk_create(
        [
            Sale(
                organization=shop.org,
                store=shop.centro if i % 2 else shop.shopping,
                customer=customers[i % 20] if i % 100 else None,  # 20 sales without a customer
                erp_id=f"B{i:05d}",
                total=Decimal("50.00"),
                sold_at=now - timedelta(minutes=i),
            )
            for i in range(2000)
        ]
    )
    assert Survey.objects.count() == 0
    ids = [s.pk for s in sales]

    with CaptureQueriesContext(connection) as queries:
        created = services.surveys_schedule(sale_ids=ids)
    assert created == 1980
    assert len(queries) <= 5, [q["sql"][:120] for q in queries]  # select, insert (+ its transaction)
    assert Survey.objects.count() == 1980
    assert Survey.objects.values("sale_id").distinct().count() == 1980

    # again, and concurrently-overlapping halves: nothing new, still a handful of queries
    with CaptureQueriesContext(connection) as queries:
        assert services.surveys_schedule(sale_ids=ids[:1500]) == 0
        assert services.surveys_schedule(sale_ids=ids[500:]) == 0
    assert len(queries) <= 4
    assert Survey.objects.count() == 1980
    one = Survey.objects.select_related("sale").get(sale_id=ids[1])
    assert one.due_at == one.sale.sold_at + timedelta(days=3)
    assert one.store_id == shop.centro.pk


def test_dispatch_enqueues_each_due_survey_once_and_leaves_the_others(shop: Shop):
    due = [shop.due_survey(c) for c in (shop.ana, shop.bruno)]
    not_yet = Survey.objects.get(sale=shop.sale(shop.ana))

    assert services.surveys_dispatch() == 2
    assert sorted(_queued_job_ids()) == sorted(f"survey-{s.pk}" for s in due)
    # the next minute's run (or a second scheduler) finds their jobs alive: nothing enqueued twice
    assert services.surveys_dispatch() == 0
    assert len(_queued_job_ids()) == 2
    assert f"survey-{not_yet.pk}" not in _queued_job_ids()


def test_dispatch_respects_its_limit_oldest_first(shop: Shop):
    first = shop.due_survey(shop.ana)
    Survey.objects.filter(pk=first.pk).update(due_at=timezone.now() - timedelta(days=2))
    shop.due_survey(shop.bruno)

    assert services.surveys_dispatch(limit=1) == 1
    assert _queued_job_ids() == [f"survey-{first.pk}"]
    assert services.surveys_dispatch(limit=1) == 0  # the oldest is still queued
    assert services.surveys_dispatch(limit=2) == 1


def test_the_dispatch_is_in_the_cron_table_every_minute():
    entry = cron.cron_table()["surveys-dispatch"]
    assert entry.cron == "* * * * *"
    assert entry.func == "surveys.tasks.surveys_dispatch"


def test_the_recovery_pass_re_enqueues_due_surveys_redis_lost(shop: Shop, redis_db):
    due = [shop.due_survey(c) for c in (shop.ana, shop.bruno)]
    shop.sale(shop.ana)  # not due yet

    assert recovery.recover()["post-sale-surveys"] == 2
    assert recovery.recover()["post-sale-surveys"] == 0
    redis_db.flushdb()
    assert recovery.recover()["post-sale-surveys"] == 2
    assert sorted(_queued_job_ids()) == sorted(f"survey-{s.pk}" for s in due)


@pytest.mark.parametrize(
    ("typed", "stored", "shown"),
    [
        ("1.234,56", "1234.56", "1.234,56"),
        ("150,00", "150.00", "150,00"),
        ("150.00", "150.00", "150,00"),
        ("99,9", "99.90", "99,90"),
    ],
)
def test_a_sales_total_is_read_as_the_manager_types_it_in_pt_br(
    shop: Shop, admin_client, typed, stored, shown
):
    # Money in the admin's forms reads the locale's numbers: "150,00" was "Informe um número".
    response = admin_client.post(
        "/admin/crm/sale/add/",
        {
            "organization": shop.org.pk,
            "store": shop.centro.pk,
            "customer": shop.bruno.pk,
            "erp_id": "ADMIN-PT",
            "total": typed,
            "sold_at_0": "2026-03-10",
            "sold_at_1": "15:30:00",
        },
        HTTP_ACCEPT_LANGUAGE="pt-br",
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    assert Sale.objects.get(erp_id="ADMIN-PT").total == Decimal(stored)
    sale = Sale.objects.get(erp_id="ADMIN-PT")
    page = admin_client.get(
        f"/admin/crm/sale/{sale.pk}/change/", HTTP_ACCEPT_LANGUAGE="pt-br"
    ).content.decode()
    assert f'name="total" value="{shown}"' in page
