"""The ERP world: an organization with the sandbox's three stores, its ERP connection pointed at a
Millennium sandbox running on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import date, timedelta
from typing import Any

import pytest
from django.utils import timezone

from crm.models import Customer, Organization, Store
from erp.models import ErpConnection
from project.sandboxes.millennium import MillenniumSandbox
from project.sandboxes.millennium_data import DEFAULT_PASSWORD, DEFAULT_STORES, DEFAULT_USERNAME


@pytest.fixture
def sandbox_factory() -> Iterator[Callable[..., MillenniumSandbox]]:
    started: list[MillenniumSandbox] = []

    def make(**kwargs: Any) -> MillenniumSandbox:
        server = MillenniumSandbox(**kwargs).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def erp_sandbox(sandbox_factory) -> MillenniumSandbox:
    return sandbox_factory(customers=2500)


def make_world(sandbox: MillenniumSandbox, **connection_fields: Any) -> dict[str, Any]:
    org = Organization.objects.create(name="Loja Teste", slug="teste", survey_channel="email")
    stores = [
        Store.objects.create(organization=org, erp_code=code, name=f"Loja {code}") for code in DEFAULT_STORES
    ]
    connection = ErpConnection(
        organization=org,
        base_url=sandbox.url,
        username=DEFAULT_USERNAME,
        **{"page_size": 1000, "timeout_seconds": 10, **connection_fields},
    )
    connection.set_password(DEFAULT_PASSWORD)
    connection.save()
    return {"org": org, "stores": stores, "store": stores[0], "connection": connection, "sandbox": sandbox}


@pytest.fixture
def erp(transactional_db, erp_sandbox) -> dict[str, Any]:
    return make_world(erp_sandbox)


def recent_day() -> date:
    """Yesterday in São Paulo: recent enough for its sales to get post-sale surveys."""
    return timezone.localdate() - timedelta(days=1)


def customers_snapshot(org: Organization) -> list[tuple]:
    return list(
        Customer.objects.filter(organization=org)
        .order_by("erp_id")
        .values_list(
            "erp_id", "name", "email", "phone", "cpf_cnpj", "erp_trans_id", "erp_registered_at", "updated_at"
        )
    )
