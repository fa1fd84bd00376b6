"""The "sales written" hook: every path that writes sales tells every registered consumer, once per
write, with the sales' ids and which of them are new — the ERP sync's bulk pages (no Django signal)
as well as a sale saved in the admin or through the ORM."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from crm import hooks
from crm.models import Organization, Sale, Store
from erp import services
from project.sandboxes.millennium_data import OFFSET
from tests.erp.conftest import recent_day


@pytest.fixture
def told() -> Iterator[list[hooks.SalesWritten]]:
    events: list[hooks.SalesWritten] = []

    def record(event: hooks.SalesWritten) -> int:
        events.append(event)
        return len(event.created_ids)

    hooks.on_sales_written("test-recorder", record)
    yield events
    hooks.off_sales_written("test-recorder")


def test_the_apps_plug_in_once_with_attribution_last():
    consumers = hooks.sales_consumers()
    assert {"surveys", "attributed"} <= set(consumers)
    assert consumers[-1] == "attributed"  # its statement takes the lock held until the commit


def test_each_erp_page_tells_every_consumer_its_sales_and_which_are_new(erp, told):
    org, store, connection = erp["org"], erp["store"], erp["connection"]
    services.customers_sync(connection=connection, full=True)
    day = recent_day()
    start = datetime(day.year, day.month, day.day, tzinfo=OFFSET)
    first = services.sales_sync(store=store, start=start, end=start + timedelta(days=1))
    sales = set(Sale.objects.filter(organization=org, store=store).values_list("pk", flat=True))
    assert first.created == len(sales) > 0
    assert {e.organization_id for e in told} == {org.pk}
    assert set().union(*(e.sale_ids for e in told)) == sales
    assert set().union(*(e.created_ids for e in told)) == sales
    assert first.surveys == 22  # the surveys consumer's count reaches the sync's result

    told.clear()
    again = services.sales_sync(store=store, start=start, end=start + timedelta(days=1))
    assert again.created == 0
    assert set().union(*(e.sale_ids for e in told)) == sales  # evaluated again (attribution)
    assert not any(e.created_ids for e in told)  # but nothing is new: no second survey


def test_a_sale_saved_one_by_one_tells_every_consumer(db, told):
    org = Organization.objects.create(name="Loja", slug="loja")
    store = Store.objects.create(organization=org, erp_code="001", name="Loja 001")
    sale = Sale.objects.create(
        organization=org, store=store, erp_id="A-1", total=Decimal("10.00"), sold_at=timezone.now()
    )
    assert told == [hooks.SalesWritten(org.pk, (sale.pk,), (sale.pk,))]
    sale.total = Decimal("12.00")
    sale.save(update_fields=["total"])
    assert told[-1] == hooks.SalesWritten(org.pk, (sale.pk,), ())


def test_nothing_written_tells_nobody(db, told):
    counts = hooks.sales_written(organization_id=1, sale_ids=[])
    assert counts == {name: 0 for name in hooks.sales_consumers()}
    assert told == []
