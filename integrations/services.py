"""Writes on integration settings."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db.models import QuerySet
from django.utils import timezone

from crm.models import Organization, Store
from crm.services import DEMO_STORES, REASON_MAX, organizations_resume
from integrations.models import EmailSettings, WhatsappNumber, WhatsappPrice

logger = logging.getLogger(__name__)

DEMO_PHONE_NUMBER_ID = "100000000000001"
DEMO_ACCESS_TOKEN = "demo-access-token"  # noqa: S105 - the sandbox's token, not a real credential


def demo_store_phone_number_id(index: int) -> str:
    """The sandbox phone number id of the demo organization's store number `index` (0: the
    organization's own, DEMO_PHONE_NUMBER_ID)."""
    return f"{int(DEMO_PHONE_NUMBER_ID) + index}"


# The sandbox accepts the demo token for these numbers (manage.py up tells it about each).
DEMO_PHONE_NUMBER_IDS = tuple(demo_store_phone_number_id(i) for i in range(len(DEMO_STORES)))


def whatsapp_number_demo(*, organization: Organization, graph_url: str) -> WhatsappNumber:
    """Give each demo store a WhatsApp number pointed at `graph_url` (the sandbox), the first store's
    being the organization's (campaigns send from it by default); returns that one. Safe to run twice."""
    numbers = [
        _demo_number(organization, store, index, graph_url)
        for index, store in enumerate(organization.stores.order_by("erp_code")[: len(DEMO_STORES)])
    ]
    # Demo rates (USD per marketing message); real ones come from the pricing sync.
    for country, price in (("BR", "0.0625"), ("*", "0.0700")):
        WhatsappPrice.objects.update_or_create(
            category="marketing", country=country, defaults={"price": price}
        )
    return numbers[0]


def _demo_number(organization: Organization, store: Store, index: int, graph_url: str) -> WhatsappNumber:
    phone_number_id = demo_store_phone_number_id(index)
    number = WhatsappNumber.objects.filter(phone_number_id=phone_number_id).first() or WhatsappNumber(
        phone_number_id=phone_number_id
    )
    number.organization = organization
    number.store = store
    number.display_phone_number = f"+55119400000{index:02d}"
    number.graph_url = graph_url
    number.paused_at, number.paused_reason = None, ""
    number.set_access_token(DEMO_ACCESS_TOKEN)
    number.save()
    Store.objects.filter(pk=store.pk).update(whatsapp_number=number)
    return number


def whatsapp_numbers_pause(*, organization_id: int, number_ids: Iterable[int], reason: str) -> int:
    """Stop the sends of these numbers of the organization until an operator resumes them: Meta
    refused the number itself (its token, registration, display name, quality); the organization's
    other numbers go on. An existing pause, its time and reason, is kept. Returns how many this call
    paused, each logged as an error."""
    paused = 0
    for number_id in sorted(set(number_ids)):  # a batch's few numbers: a statement and a log each
        numbers = WhatsappNumber.objects.filter(
            organization_id=organization_id, pk=number_id, paused_at__isnull=True
        )
        if numbers.update(paused_at=timezone.now(), paused_reason=reason[:REASON_MAX]):
            paused += 1
            logger.error(
                "WhatsApp number %s paused: %s", number_id, reason, extra={"organization_id": organization_id}
            )
    return paused


def whatsapp_numbers_resume(*, numbers: QuerySet[WhatsappNumber]) -> int:
    """Clear the pause of these numbers (an operator fixed its cause); returns how many were paused.
    Their waiting send batches look again within a minute."""
    return numbers.filter(paused_at__isnull=False).update(paused_at=None, paused_reason="")


def email_settings_demo(*, organization: Organization, host: str, port: int) -> EmailSettings:
    """Point the demo organization's email at an SMTP server with no TLS and no login (the sandbox).

    Safe to run twice. The rate is high so the demo finishes quickly; set it in the admin."""
    email_settings, _ = EmailSettings.objects.update_or_create(
        organization=organization,
        defaults={
            "provider": EmailSettings.Provider.SMTP,
            "host": host,
            "port": port,
            "security": EmailSettings.Security.NONE,
            "username": "",
            "password_encrypted": "",
            "sender_name": organization.name,
            "sender_email": "ofertas@loja-demo.example.com.br",
            "unsubscribe_mailto": "descadastro@loja-demo.example.com.br",
            "messages_per_minute": 6000,
        },
    )
    if organization.email_paused_at:
        organizations_resume(organization_ids=[organization.pk], channel="email")
    return email_settings


def whatsapp_prices_sync(*, url: str) -> dict[str, int]:
    """Fetch the rate card at `url` and upsert every price; returns {"rates": n, "skipped": m}."""
    import logging

    import httpx

    from integrations import http
    from integrations.errors import IntegrationError
    from integrations.whatsapp.pricing import parse_rate_card

    with http.client() as client:
        try:
            response = client.get(url)
        except httpx.HTTPError as exc:  # timeouts, refused connections: retry later
            raise IntegrationError(f"rate card unreachable: {exc}", retryable=True) from exc
    if response.status_code != 200:
        raise IntegrationError(
            f"rate card answered HTTP {response.status_code}",
            retryable=response.status_code >= 500,
            status=response.status_code,
        )
    rates, problems = parse_rate_card(response.text)
    for problem in problems:
        logging.getLogger(__name__).warning("rate card %s: %s", url, problem)
    WhatsappPrice.objects.bulk_create(
        [
            WhatsappPrice(country=r.country, category=r.category, price=r.price, currency=r.currency)
            for r in rates
        ],
        update_conflicts=True,
        unique_fields=["category", "country"],
        update_fields=["price", "currency", "updated_at"],
    )
    return {"rates": len(rates), "skipped": len(problems)}
