"""The syncs in process against the sandbox: bulk upserts, idempotence, the high-water mark,
malformed records, placeholders for customers and surveys for new sales."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db.models import Count

from crm.models import Customer, Sale
from erp import services, upserts
from erp.models import ErpConnection, ErpSyncIssue
from integrations.millennium.client import ErpCustomer
from project.sandboxes.millennium_data import OFFSET
from surveys.models import Survey
from tests.erp.conftest import customers_snapshot, make_world, recent_day


def _window(day):
    start = datetime(day.year, day.month, day.day, tzinfo=OFFSET)
    return start, start + timedelta(days=1)


def test_a_full_sync_upserts_every_customer_and_a_second_run_changes_nothing(erp):
    org, connection, sandbox = erp["org"], erp["connection"], erp["sandbox"]
    first = services.customers_sync(connection=connection, full=True)
    assert (first.read, first.upserted, first.created, first.changed, first.skipped) == (
        2500,
        2500,
        2500,
        0,
        0,
    )
    assert first.pages == 3 and first.trans_id == 25_000
    assert Customer.objects.filter(organization=org).count() == 2500
    ana = Customer.objects.get(organization=org, erp_id="1000")
    assert ana.name == "ANA SILVA" and ana.email == "ana.silva0@example.com.br"
    assert ana.phone.startswith("+5511") and len(ana.cpf_cnpj) == 11 and ana.erp_trans_id == 10
    company = Customer.objects.get(organization=org, erp_id="1019")
    assert len(company.cpf_cnpj) == 14  # a CNPJ
    old_mobile = Customer.objects.get(organization=org, erp_id="1010")  # sent as 91 / 9007-9190
    assert old_mobile.phone == "+5591990079190"
    assert Customer.objects.get(organization=org, erp_id="1006").phone == ""  # no mobile in the ERP
    connection.refresh_from_db()
    assert connection.customers_trans_id == 25_000
    assert connection.customers_full_cursor is None and connection.customers_full_synced_at is not None

    before = customers_snapshot(org)
    sandbox.clear_requests()
    second = services.customers_sync(connection=connection, full=True)
    assert (second.read, second.created, second.changed) == (2500, 0, 0)
    assert sandbox.requests()[0]["params"]["trans_id"] == "0"  # a new full sync starts from the beginning
    assert customers_snapshot(org) == before  # not even updated_at moved
    assert (
        Customer.objects.filter(organization=org)
        .values("erp_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
        == 0
    )


def test_an_incremental_sync_asks_from_the_high_water_mark_and_takes_only_changes(erp):
    org, connection, sandbox = erp["org"], erp["connection"], erp["sandbox"]
    services.customers_sync(connection=connection, full=True)
    sandbox.touch_customers([3, 7])
    sandbox.add_customers(5)
    sandbox.clear_requests()
    result = services.customers_sync(connection=connection, full=False)
    assert [r["params"]["trans_id"] for r in sandbox.requests()] == ["25000", "25007"]
    assert (result.read, result.created, result.changed) == (7, 5, 2)
    assert result.trans_id == 25_007
    assert Customer.objects.filter(organization=org).count() == 2505
    assert Customer.objects.get(organization=org, erp_id="1003").email.endswith(".v1@example.com.br")
    connection.refresh_from_db()
    assert connection.customers_trans_id == 25_007

    # Nothing new: one request, nothing written.
    sandbox.clear_requests()
    again = services.customers_sync(connection=connection, full=False)
    assert (again.read, again.created, again.changed) == (0, 0, 0)
    assert [r["params"]["trans_id"] for r in sandbox.requests()] == ["25007"]


def test_an_older_copy_of_a_customer_never_overwrites_a_newer_one(erp):
    org = erp["org"]

    def copy(trans_id: int, email: str) -> ErpCustomer:
        return ErpCustomer(
            erp_id="77", trans_id=trans_id, name="ANA", cpf_cnpj="", email=email, phone="", registered_at=None
        )

    assert upserts.customers_upsert(organization_id=org.pk, customers=[copy(50, "new@example.com.br")]) == (
        1,
        0,
    )
    assert upserts.customers_upsert(organization_id=org.pk, customers=[copy(40, "old@example.com.br")]) == (
        0,
        0,
    )
    assert upserts.customers_upsert(organization_id=org.pk, customers=[copy(50, "new@example.com.br")]) == (
        0,
        0,
    )
    assert Customer.objects.get(organization=org, erp_id="77").email == "new@example.com.br"
    assert upserts.customers_upsert(organization_id=org.pk, customers=[copy(60, "newer@example.com.br")]) == (
        0,
        1,
    )
    assert Customer.objects.get(organization=org, erp_id="77").email == "newer@example.com.br"


def test_a_record_without_an_opt_in_never_touches_consent(erp):
    org, connection = erp["org"], erp["connection"]
    # Customer 12 of the sandbox carries no opt-in field: what is stored stays, either way.
    Customer.objects.create(organization=org, erp_id="1012", name="x", marketing_consent=True)
    services.customers_sync(connection=connection, full=True)
    kept = Customer.objects.get(organization=org, erp_id="1012")
    assert kept.name != "x" and kept.marketing_consent is True


def test_malformed_customers_are_skipped_and_reported_once(sandbox_factory, transactional_db):
    world = make_world(sandbox_factory(customers=2500, malformed_every=100))
    org, connection = world["org"], world["connection"]
    result = services.customers_sync(connection=connection, full=True)
    assert (result.read, result.upserted, result.skipped) == (2500, 2475, 25)
    assert result.trans_id == 25_000  # the malformed last record still moved the high-water mark
    assert Customer.objects.filter(organization=org).count() == 2475
    assert not Customer.objects.filter(organization=org, erp_id="1099").exists()
    issues = ErpSyncIssue.objects.filter(organization=org, kind="customer")
    assert issues.count() == 25
    issue = issues.get(external_id="1099")
    assert "/Date" in issue.reason and issue.trans_id == 1000 and '"cliente": 1099' in issue.payload
    assert issues.filter(external_id="").count() == 8  # the ones without a cliente id

    services.customers_sync(connection=connection, full=True)
    assert issues.count() == 25
    assert set(issues.values_list("times_seen", flat=True)) == {2}
    assert Customer.objects.filter(organization=org).count() == 2475


def test_a_sales_window_synced_twice_leaves_the_same_database(erp):
    org, store, connection, sandbox = erp["org"], erp["store"], erp["connection"], erp["sandbox"]
    services.customers_sync(connection=connection, full=True)
    start, end = _window(recent_day())
    first = services.sales_sync(store=store, start=start, end=end)
    assert (first.read, first.created, first.changed, first.skipped) == (24, 24, 0, 0)
    sales = Sale.objects.filter(organization=org, store=store)
    assert sales.count() == 24
    assert sales.filter(customer__isnull=True).count() == 2  # anonymous sales
    # Every identified sale got its post-sale survey scheduled, once.
    assert first.surveys == 22 == Survey.objects.filter(sale__in=sales).count()
    sale = sales.order_by("erp_id").first()
    expected = sandbox.sales_of_day(store.erp_code, recent_day())[0]
    assert sale.erp_id == str(expected["pedidov"]) and sale.erp_trans_id == expected["trans_id"]
    assert sale.total == Decimal(str(expected["valor_final"])).quantize(Decimal("0.01"))
    assert [i["product"] for i in sale.items] == [i["produto"] for i in expected["itens"]]
    assert sale.total == sum(Decimal(i["quantity"]) * Decimal(i["price"]) for i in sale.items)

    snapshot = lambda: list(  # noqa: E731
        Sale.objects.filter(organization=org)
        .order_by("erp_id")
        .values_list("erp_id", "store_id", "customer_id", "total", "sold_at", "items", "erp_trans_id")
    )
    before, customers_before = snapshot(), customers_snapshot(org)
    second = services.sales_sync(store=store, start=start, end=end)
    assert (second.read, second.created, second.changed, second.surveys, second.customers_created) == (
        24,
        0,
        0,
        0,
        0,
    )
    assert snapshot() == before
    assert customers_snapshot(org) == customers_before
    assert Survey.objects.filter(organization=org).count() == 22


def test_a_sale_of_a_customer_not_synced_yet_gets_a_placeholder_that_the_customer_sync_fills(erp):
    org, store, connection = erp["org"], erp["store"], erp["connection"]
    start, end = _window(recent_day())
    result = services.sales_sync(store=store, start=start, end=end)
    identified = Sale.objects.filter(store=store, customer__isnull=False)
    assert identified.count() == 22
    assert result.customers_created == identified.values("customer").distinct().count()
    placeholder = identified.first().customer
    assert placeholder.erp_id and placeholder.name == "" and placeholder.erp_trans_id is None

    services.customers_sync(connection=connection, full=True)
    placeholder.refresh_from_db()
    assert placeholder.name and placeholder.erp_trans_id is not None
    assert Customer.objects.filter(organization=org).count() == 2500  # filled in, not duplicated


def test_malformed_sales_are_skipped_and_reported(sandbox_factory, transactional_db):
    world = make_world(sandbox_factory(customers=100, malformed_every=5))
    store = world["store"]
    start, end = _window(recent_day())
    result = services.sales_sync(store=store, start=start, end=end)
    assert (result.read, result.upserted, result.skipped) == (24, 20, 4)
    assert Sale.objects.filter(store=store).count() == 20
    issues = ErpSyncIssue.objects.filter(organization=world["org"], kind="sale", store=store)
    reasons = " | ".join(issues.values_list("reason", flat=True))
    assert issues.count() == 4
    assert "valor_final" in reasons and "/Date" in reasons and "itens" in reasons
    services.sales_sync(store=store, start=start, end=end)
    assert issues.count() == 4 and Sale.objects.filter(store=store).count() == 20


def test_a_sync_asks_only_for_its_window_and_store(erp):
    store, sandbox = erp["stores"][1], erp["sandbox"]
    day = recent_day()
    start = datetime(day.year, day.month, day.day, 10, tzinfo=OFFSET)
    result = services.sales_sync(store=store, start=start, end=start + timedelta(hours=1))
    in_hour = Sale.objects.filter(store=store)
    assert 0 < in_hour.count() == result.created < len(sandbox.sales_of_day(store.erp_code, day))
    assert all(start <= s.sold_at < start + timedelta(hours=1) for s in in_hour)
    params = sandbox.requests()[0]["params"]
    assert params["filial"] == store.erp_code
    assert params["data_inicial"] == start.isoformat()


def test_the_high_water_mark_moves_only_with_committed_pages(erp):
    """A sync that fails on its third page keeps what the first two committed, and resumes there."""
    org, connection, sandbox = erp["org"], erp["connection"], erp["sandbox"]
    sandbox.fail_next(1, 502, after=2)  # the third page fails
    with pytest.raises(Exception, match="502"):
        services.customers_sync(connection=connection, full=True)
    connection.refresh_from_db()
    assert connection.customers_trans_id == 20_000
    assert connection.customers_full_cursor == 20_000
    assert Customer.objects.filter(organization=org).count() == 2000
    sandbox.clear_requests()
    result = services.customers_sync(connection=connection, full=True)
    assert result.resumed and result.started_trans_id == 20_000
    assert sandbox.requests()[0]["params"]["trans_id"] == "20000"
    assert Customer.objects.filter(organization=org).count() == 2500
    assert ErpConnection.objects.get(pk=connection.pk).customers_full_cursor is None


def test_a_late_retry_of_an_older_days_full_sync_leaves_the_newer_one_alone(erp):
    connection, sandbox = erp["connection"], erp["sandbox"]
    today = recent_day() + timedelta(days=1)
    sandbox.fail_next(1, 503, after=1)
    with pytest.raises(Exception, match="503"):
        services.customers_sync(connection=connection, full=True, day=today)
    sandbox.clear_requests()
    result = services.customers_sync(connection=connection, full=True, day=recent_day())
    assert result.read == 0 and sandbox.requests() == []
    connection.refresh_from_db()
    assert (connection.customers_full_day, connection.customers_full_cursor) == (today, 10_000)


def test_each_synced_page_of_sales_is_attributed_to_the_campaigns_that_reached_its_customers(erp, english):
    from campaigns.models import (
        Campaign,
        CampaignRevenue,
        Channel,
        EmailMessage,
        SaleAttribution,
        WhatsappMessage,
    )

    org, store, sandbox = erp["org"], erp["store"], erp["sandbox"]
    erp["connection"].page_size = 10  # 24 sales: three pages, three statements
    erp["connection"].save()
    day = recent_day()
    start, end = _window(day)
    records = sandbox.sales_of_day(store.erp_code, day)
    buyers = sorted({str(r["cliente"]) for r in records if r["cliente"] is not None})
    customers = {
        erp_id: Customer.objects.create(organization=org, erp_id=erp_id, name=f"Cliente {erp_id}")
        for erp_id in buyers
    }
    whatsapp = Campaign.objects.create(organization=org, name="Semana", channel=Channel.WHATSAPP)
    email = Campaign.objects.create(organization=org, name="Newsletter", channel=Channel.EMAIL)
    reached_wa, reached_email = buyers[: len(buyers) // 2], buyers[len(buyers) // 2 :][:3]
    for erp_id in reached_wa:  # the day before: within the window of every sale of the day
        WhatsappMessage.objects.create(
            campaign=whatsapp,
            organization=org,
            customer=customers[erp_id],
            status="read",
            sent_at=start - timedelta(days=1),
        )
    for erp_id in reached_email:  # at the day's start, after the WhatsApp message: the last touch
        EmailMessage.objects.create(
            campaign=email, organization=org, customer=customers[erp_id], status="sent", sent_at=start
        )

    result = services.sales_sync(store=store, start=start, end=end)
    assert result.pages == 3 and result.created == 24

    def expected(erp_ids: list[str]) -> tuple[Decimal, int]:
        mine = [r for r in records if str(r["cliente"]) in erp_ids]
        return sum((Decimal(str(r["valor_final"])).quantize(Decimal("0.01")) for r in mine), Decimal(0)), len(
            mine
        )

    wa_only = [b for b in reached_wa if b not in reached_email]
    assert result.attributed == expected(wa_only)[1] + expected(reached_email)[1] > 0
    revenue = {row.campaign_id: (row.revenue, row.conversions) for row in CampaignRevenue.objects.all()}
    assert revenue == {whatsapp.pk: expected(wa_only), email.pk: expected(reached_email)}
    assert SaleAttribution.objects.count() == result.attributed
    assert "attributed to campaigns" in result.summary()

    # The same window again: the same attributions, none written again.
    before = list(
        SaleAttribution.objects.order_by("sale_id").values_list("sale_id", "campaign_id", "attributed_at")
    )
    again = services.sales_sync(store=store, start=start, end=end)
    assert again.attributed == result.attributed
    assert (
        list(
            SaleAttribution.objects.order_by("sale_id").values_list("sale_id", "campaign_id", "attributed_at")
        )
        == before
    )
    assert {
        row.campaign_id: (row.revenue, row.conversions) for row in CampaignRevenue.objects.all()
    } == revenue
