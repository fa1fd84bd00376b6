"""RQ job functions of the messaging layer: take ids, load fresh state, call the services."""

from __future__ import annotations

from messaging import chatwoot_inbound, conversations


def conversation_reply_send(message_id: int) -> str:
    """Send one queued free-form reply; safe to run twice (claimed first)."""
    return conversations.reply_send(message_id=message_id)


def chatwoot_push(organization_id: int) -> int:
    """Deliver what waits for the organization's Chatwoot, oldest first; safe to run twice."""
    return chatwoot_inbound.push(organization_id=organization_id)
