"""The demo organization (slug "demo"): its stores, customers and past sales. Demo data only: the
composition root (project/: `manage.py demo`, `demo_campaign`, `up`) and other apps' demo modules
import it, never a production module (the `demo` import contract)."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from crm.models import Customer, Organization, Sale, Store
from integrations.millennium.client import ErpCustomer

# The one generator of demo phone numbers lives in runner.demo: the runner loads that module by its
# stored path, and it may import no other demo module (the `demo` import contract).
from runner.demo import demo_phone

DEMO_SLUG = "demo"
DEMO_STORES = [("001", "Centro"), ("002", "Shopping Ibirapuera"), ("003", "Loja online")]
_FIRST = [
    "Ana",
    "Bruno",
    "Camila",
    "Diego",
    "Eduarda",
    "Felipe",
    "Gabriela",
    "Henrique",
    "Isabela",
    "João",
    "Larissa",
    "Marcos",
    "Natália",
    "Otávio",
    "Paula",
    "Rafael",
    "Sofia",
    "Thiago",
    "Vitória",
    "Yuri",
]
_LAST = ["Silva", "Santos", "Oliveira", "Souza", "Rodrigues", "Ferreira", "Alves", "Pereira", "Lima", "Gomes"]


def _ascii(name: str) -> str:
    return unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()


def demo_load(
    *,
    customers_upsert: Callable[..., Any],
    customers: int = 50,
    batch: int = 2000,
    progress: Callable[[int], None] | None = None,
) -> Organization:
    """Create or update the demo organization, its stores and `customers` customers. The customers
    arrive as ERP records that carry the ERP's opt-in, written by `customers_upsert` (the ERP sync's,
    given by the composition root): consent comes only from a source that carries it, the demo's
    too. Safe to run twice."""
    # Contact caps counted per channel in the demo (only when created: an operator's choice stays),
    # so the demo's WhatsApp campaign and then its email campaign both reach everyone.
    org, _ = Organization.objects.update_or_create(
        slug=DEMO_SLUG,
        defaults={"name": "Loja Demo", "timezone": "America/Sao_Paulo"},
        create_defaults={
            "name": "Loja Demo",
            "timezone": "America/Sao_Paulo",
            "contact_caps_scope": Organization.ContactCapsScope.PER_CHANNEL,
        },
    )
    for code, name in DEMO_STORES:
        Store.objects.update_or_create(organization=org, erp_code=code, defaults={"name": name})
    for start in range(0, customers, batch):
        rows = []
        for i in range(start, min(start + batch, customers)):
            first, last = _FIRST[i % len(_FIRST)], _LAST[(i // len(_FIRST)) % len(_LAST)]
            rows.append(
                ErpCustomer(
                    erp_id=f"DEMO-{i:07d}",
                    trans_id=1,
                    name=f"{first} {last}",
                    cpf_cnpj="",
                    email=f"{_ascii(first)}.{i}@example.com.br",
                    phone=demo_phone(i),
                    registered_at=None,
                    marketing_opt_in=True,
                )
            )
        with transaction.atomic():
            customers_upsert(organization_id=org.pk, customers=rows)
        if progress:
            progress(len(rows))
    demo_sales(org=org, customers=customers)
    return org


def demo_sales(*, org: Organization, customers: int) -> None:
    """One past sale per demo customer, at the stores in turn (so a campaign sent from the customer's
    store has stores to pick); bulk, so no survey is scheduled. Safe to run twice."""
    stores = list(Store.objects.filter(organization=org).order_by("erp_code"))
    by_erp_id = dict(
        Customer.objects.filter(organization=org, erp_id__startswith="DEMO-").values_list("erp_id", "pk")
    )
    now = timezone.now()
    sales = [
        Sale(
            organization=org,
            store=stores[i % len(stores)],
            customer_id=by_erp_id[f"DEMO-{i:07d}"],
            erp_id=f"DEMO-S{i:07d}",
            total=Decimal(100 + i % 400) + Decimal("0.90"),
            sold_at=now - timedelta(days=1 + i % 60),
        )
        for i in range(customers)
        if f"DEMO-{i:07d}" in by_erp_id
    ]
    Sale.objects.bulk_create(sales, ignore_conflicts=True, batch_size=2000)
