from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pytest
from django.utils import timezone

from crm.models import Sale
from flows import services
from flows.models import Flow
from tests.campaigns import conftest as campaigns_conftest

# The campaigns' WhatsApp sandbox world, reused as is.
sandbox = campaigns_conftest.sandbox
wa = campaigns_conftest.wa

THANKS = {
    "key": "thanks-after-sale",
    "name": "Obrigado pela compra",
    "trigger": {"type": "sale", "min_total": "100.00"},
    "reentry": "once",
    "exit_on": ["sale"],
    "steps": [
        {"type": "wait", "minutes": 0},
        {
            "type": "send_whatsapp",
            "template": "obrigado_compra",
            "language": "pt_BR",
            "variables": ["first_name"],
        },
        {"type": "wait", "days": 3, "at": "10:00"},
        {
            "type": "send_email",
            "subject": "Oi {{ first_name }}",
            "body": "<mjml></mjml>",
            "body_format": "mjml",
        },
    ],
}


@pytest.fixture
def make_flow(wa) -> Callable[..., Flow]:
    def _make(data: dict | None = None, **changes) -> Flow:
        flow, _ = services.flow_import(data={**(data or THANKS), **changes}, organization_slug=wa["org"].slug)
        return flow

    return _make


@pytest.fixture
def sell(wa) -> Callable[..., Sale]:
    counter = iter(range(1, 1_000_000))

    def _sell(customer, total: str = "150.00") -> Sale:
        return Sale.objects.create(
            organization=wa["org"],
            store=wa["store"],
            customer=customer,
            erp_id=f"S{next(counter)}",
            total=Decimal(total),
            sold_at=timezone.now(),
        )

    return _sell
