"""The ERP's bulk customer pages announce `customer_created` (crm.hooks) for the customers that
arrive — rows inserted, and sales' placeholders described for the first time — and only for them:
an updated customer, a page synced again and a placeholder itself are not announced."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

import pytest

from crm import hooks
from crm.models import Customer, Sale
from erp import services
from flows import services as flow_services
from flows.models import Enrollment
from project.sandboxes.millennium_data import OFFSET
from tests.erp.conftest import recent_day


@pytest.fixture
def arrived() -> Iterator[list[hooks.CustomerEvent]]:
    events: list[hooks.CustomerEvent] = []

    def record(batch: Sequence[hooks.CustomerEvent]) -> int:
        events.extend(e for e in batch if e.kind == "customer_created")
        return len(batch)

    hooks.on_customer_events("test-arrivals", record)
    yield events
    hooks.off_customer_events("test-arrivals")


def test_a_full_sync_announces_each_new_customer_once_and_a_second_run_none(erp, arrived):
    org, connection, sandbox = erp["org"], erp["connection"], erp["sandbox"]
    services.customers_sync(connection=connection, full=True)
    ids = set(Customer.objects.filter(organization=org).values_list("pk", flat=True))
    assert len(ids) == 2500
    assert sorted(e.customer_id for e in arrived) == sorted(ids)
    assert {(e.organization_id, e.key) for e in arrived} == {(org.pk, f"c:{e.customer_id}") for e in arrived}

    arrived.clear()
    services.customers_sync(connection=connection, full=True)
    assert arrived == []  # nothing new, nothing announced

    sandbox.touch_customers([3, 7])  # changed: updated, not announced
    new = sandbox.add_customers(2)
    services.customers_sync(connection=connection, full=False)
    assert len(new) == 2
    fresh = set(Customer.objects.filter(organization=org).values_list("pk", flat=True)) - ids
    assert sorted(e.customer_id for e in arrived) == sorted(fresh) and len(fresh) == 2


def test_a_placeholder_is_announced_when_the_customer_sync_describes_it(erp, arrived):
    org, store, connection = erp["org"], erp["store"], erp["connection"]
    day = recent_day()
    start = datetime(day.year, day.month, day.day, tzinfo=OFFSET)
    services.sales_sync(store=store, start=start, end=start + timedelta(days=1))
    placeholders = set(
        Sale.objects.filter(store=store, customer__isnull=False).values_list("customer_id", flat=True)
    )
    assert placeholders and arrived == []  # an ERP id without a name or contacts has not arrived yet

    services.customers_sync(connection=connection, full=True)
    announced = [e.customer_id for e in arrived]
    assert len(announced) == len(set(announced)) == 2500  # each once, placeholders among them
    assert placeholders <= set(announced)
    assert Customer.objects.filter(organization=org).count() == 2500


def test_a_customer_created_flow_enrolls_the_customers_an_erp_page_brings(erp):
    org, connection, sandbox = erp["org"], erp["connection"], erp["sandbox"]
    services.customers_sync(connection=connection, full=True)  # before the flow: nobody enters
    flow, _ = flow_services.flow_import(
        data={
            "key": "welcome",
            "name": "Boas-vindas",
            "trigger": {"type": "customer_created"},
            "steps": [{"type": "wait", "days": 1}],
        },
        organization_slug=org.slug,
    )
    sandbox.touch_customers([1])
    sandbox.add_customers(3)
    services.customers_sync(connection=connection, full=False)
    entered = Enrollment.objects.filter(flow=flow).values_list("customer__erp_id", flat=True)
    newest = Customer.objects.filter(organization=org).order_by("-pk").values_list("erp_id", flat=True)[:3]
    assert sorted(entered) == sorted(newest)
