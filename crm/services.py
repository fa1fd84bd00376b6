"""Writes on the core domain."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

import phonenumbers
from django.db import transaction
from django.utils import timezone

from crm.models import Customer, Organization, Store

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
_DDD = ["11", "21", "31", "41", "47", "51", "61", "71", "81", "85", "91", "62"]


def _ascii(name: str) -> str:
    return unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()


def demo_phone(i: int) -> str:
    """A valid Brazilian mobile number in E.164, deterministic in i (+55 DD 9 9XXX XXXX)."""
    number = f"+55{_DDD[i % len(_DDD)]}99{(i * 7919) % 10_000_000:07d}"
    parsed = phonenumbers.parse(number)
    assert phonenumbers.is_valid_number(parsed), number
    return phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164)


def demo_load(
    *, customers: int = 50, batch: int = 2000, progress: Callable[[int], None] | None = None
) -> Organization:
    """Create or update the demo organization, its stores and `customers` customers. Safe to run twice."""
    org, _ = Organization.objects.update_or_create(
        slug=DEMO_SLUG, defaults={"name": "Loja Demo", "timezone": "America/Sao_Paulo"}
    )
    for code, name in DEMO_STORES:
        Store.objects.update_or_create(organization=org, erp_code=code, defaults={"name": name})
    now = timezone.now()
    for start in range(0, customers, batch):
        rows = []
        for i in range(start, min(start + batch, customers)):
            first, last = _FIRST[i % len(_FIRST)], _LAST[(i // len(_FIRST)) % len(_LAST)]
            rows.append(
                Customer(
                    organization=org,
                    erp_id=f"DEMO-{i:07d}",
                    name=f"{first} {last}",
                    email=f"{_ascii(first)}.{i}@example.com.br",
                    phone=demo_phone(i),
                    marketing_consent=True,
                    consent_at=now,
                )
            )
        with transaction.atomic():
            Customer.objects.bulk_create(
                rows,
                update_conflicts=True,
                unique_fields=["organization", "erp_id"],
                update_fields=["name", "email", "phone"],
            )
        if progress:
            progress(len(rows))
    return org
