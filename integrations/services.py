"""Writes on integration settings."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import httpx
from django.db.models import QuerySet
from django.utils import timezone

from crm.services import REASON_MAX
from integrations import http
from integrations.errors import IntegrationError
from integrations.models import WhatsappNumber, WhatsappPrice
from integrations.whatsapp.pricing import parse_rate_card

logger = logging.getLogger(__name__)


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


def whatsapp_prices_sync(*, url: str) -> dict[str, int]:
    """Fetch the rate card at `url` and upsert every price; returns {"rates": n, "skipped": m}."""
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
    if rates:
        # A card in another currency replaces the old one whole: no price is left in the old currency.
        WhatsappPrice.objects.exclude(currency=rates[0].currency).delete()
    return {"rates": len(rates), "skipped": len(problems)}


def whatsapp_price_currency() -> str:
    """The rate card's currency (ISO 4217; the card has one), Meta's USD when it is empty."""
    return WhatsappPrice.objects.order_by("pk").values_list("currency", flat=True).first() or "USD"
