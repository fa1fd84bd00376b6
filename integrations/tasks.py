"""RQ jobs of the integrations app."""

from __future__ import annotations

import logging

from django.conf import settings

from integrations import services

logger = logging.getLogger(__name__)


def whatsapp_prices_sync() -> dict[str, int]:
    """Weekly: refresh the WhatsApp price table from WHATSAPP_PRICING_URL (skipped when unset)."""
    if not settings.WHATSAPP_PRICING_URL:
        logger.info("WHATSAPP_PRICING_URL is not set; the price table is edited in the admin")
        return {"rates": 0, "skipped": 0}
    return services.whatsapp_prices_sync(url=settings.WHATSAPP_PRICING_URL)


def whatsapp_templates_sync() -> dict[str, int]:
    """Daily: every WhatsApp Business account's message templates, fresh from Meta."""
    return services.whatsapp_templates_sync_all()


def whatsapp_templates_sync_organization(*, organization_id: int) -> dict[str, int]:
    """One organization's templates, fresh from Meta (the admin's "sync now")."""
    return services.whatsapp_templates_sync_all(organization_id=organization_id)
