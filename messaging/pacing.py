"""The rate-limit keys (crm.ratelimit) every sender shares: a campaign and a survey sent by the same
organization's email, or from the same WhatsApp number, take their slots from one limiter."""

from __future__ import annotations


def email_key(organization_id: int) -> str:
    """The organization's email rate (EmailSettings.messages_per_minute), SMTP or ESP alike."""
    return f"email:{organization_id}"


def whatsapp_key(number_id: int) -> str:
    """The sending number's rate (WhatsappNumber.messages_per_second)."""
    return f"wa:{number_id}"
