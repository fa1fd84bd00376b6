"""Writes on integration settings."""

from __future__ import annotations

from crm.models import Organization
from integrations.models import WhatsappNumber, WhatsappPrice

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
