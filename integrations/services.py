"""Writes on integration settings."""

from __future__ import annotations

from crm.models import Organization
from integrations.models import EmailSettings, WhatsappNumber, WhatsappPrice

DEMO_PHONE_NUMBER_ID = "100000000000001"
DEMO_ACCESS_TOKEN = "demo-access-token"  # noqa: S105 - the sandbox's token, not a real credential


def whatsapp_number_demo(*, organization: Organization, graph_url: str) -> WhatsappNumber:
    """Point the demo organization's WhatsApp number at `graph_url` (the sandbox). Safe to run twice."""
    number = WhatsappNumber.objects.filter(phone_number_id=DEMO_PHONE_NUMBER_ID).first() or WhatsappNumber(
        phone_number_id=DEMO_PHONE_NUMBER_ID
    )
    number.organization = organization
    number.store = organization.stores.order_by("erp_code").first()
    number.display_phone_number = "+5511940000000"
    number.graph_url = graph_url
    number.set_access_token(DEMO_ACCESS_TOKEN)
    number.save()
    # Demo rates (USD per marketing message); real ones come from the pricing sync.
    for country, price in (("BR", "0.0625"), ("*", "0.0700")):
        WhatsappPrice.objects.update_or_create(
            category="marketing", country=country, defaults={"price": price}
        )
    return number


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
        Organization.objects.filter(pk=organization.pk).update(email_paused_at=None, email_paused_reason="")
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
