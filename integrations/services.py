"""Writes on integration settings."""

from __future__ import annotations

from django.db.models import QuerySet

from integrations.models import WhatsappNumber, WhatsappPrice


def whatsapp_numbers_resume(*, numbers: QuerySet[WhatsappNumber]) -> int:
    """Clear the pause of these numbers (an operator fixed its cause); returns how many were paused.
    Their waiting send batches look again within a minute."""
    return numbers.filter(paused_at__isnull=False).update(paused_at=None, paused_reason="")


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
