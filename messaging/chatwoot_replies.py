"""Agents' replies from Chatwoot: its `message_created` webhook, on a URL signed per organization,
accepted into the inbox (kind "chatwoot") and applied by a worker: the reply goes out from the
number the customer wrote to, inside the 24-hour window (else recorded REFUSED with the reason),
once per Chatwoot message id."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging

from django.conf import settings

from crm import inbox_kinds
from crm.models import Customer
from integrations.chatwoot.webhooks import agent_reply
from messaging import conversations
from messaging.models import ConversationMessage

logger = logging.getLogger(__name__)

KIND = "chatwoot"


def webhook_token(organization_id: int) -> str:
    """The secret part of the organization's webhook URL: `<id>-<HMAC of the id>` (SECRET_KEY signs it)."""
    digest = hmac.new(
        settings.SECRET_KEY.encode(), f"chatwoot-webhook:{organization_id}".encode(), hashlib.sha256
    ).hexdigest()[:40]
    return f"{organization_id}-{digest}"


def organization_of(token: str) -> int | None:
    """The organization a webhook token was made for, or None when it is not one of ours."""
    head, _, _ = token.partition("-")
    if not head.isdigit() or len(head) > 18:
        return None
    organization_id = int(head)
    return organization_id if hmac.compare_digest(token, webhook_token(organization_id)) else None


def replies_apply(events: list[inbox_kinds.Event]) -> None:
    """Apply a batch of accepted Chatwoot bodies: each agent's reply queued once (by Chatwoot's id)."""
    for event in events:
        reply = agent_reply(json.loads(event.payload))
        organization_id = event.organization_id
        if reply is None or organization_id is None:
            continue
        if ConversationMessage.objects.filter(
            organization_id=organization_id, chatwoot_message_id=reply.message_id, direction="out"
        ).exists():
            continue
        customer = (
            Customer.objects.filter(organization_id=organization_id, phone=reply.phone).order_by("pk").first()
        )
        if customer is None:
            logger.warning(
                "chatwoot reply %s: no customer with that phone",
                reply.message_id,
                extra={"organization_id": organization_id},
            )
            continue
        conversations.reply_queue(
            customer=customer,
            text=reply.content,
            source=ConversationMessage.Source.CHATWOOT,
            chatwoot_message_id=reply.message_id,
        )
