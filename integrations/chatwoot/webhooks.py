"""Chatwoot's account webhooks: an agent's reply (`message_created`, outgoing, not private) as plain
values. Everything else Chatwoot posts (conversation events, incoming and private messages, what we
posted ourselves) is nothing to act on, never an error."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PHONE_RE = re.compile(r"\+[1-9][0-9]{7,14}")


@dataclass(frozen=True)
class AgentReply:
    message_id: int  # Chatwoot's id of the message (a repeated webhook is recognised by it)
    conversation_id: int
    content: str
    phone: str  # the contact's phone, E.164
    source_id: str = ""


def _dict(raw: Any) -> dict[str, Any]:
    return raw if isinstance(raw, dict) else {}


def _int(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and raw.isdigit() and len(raw) < 19:
        return int(raw)
    return None


def agent_reply(payload: Any) -> AgentReply | None:
    """The agent's reply a webhook body carries, or None when it carries none (another event, an
    incoming or private message, one posted by this product, no contact phone). ValueError when the
    body is not a JSON object."""
    if not isinstance(payload, dict):
        raise ValueError("the payload must be a JSON object")
    if payload.get("event") != "message_created" or payload.get("private") not in (False, None):
        return None  # a private note (or one whose flag says anything but "not private") stays inside
    if payload.get("message_type") not in ("outgoing", 1):
        return None
    if "crm_message_id" in _dict(payload.get("content_attributes")) or "campaign_message_id" in _dict(
        payload.get("content_attributes")
    ):
        return None  # what we posted ourselves (a customer's message, a reply sent from here, a mirror)
    content = payload.get("content")
    message_id = _int(payload.get("id"))
    conversation = _dict(payload.get("conversation"))
    conversation_id = _int(conversation.get("id"))
    if not isinstance(content, str) or not content.strip() or message_id is None or conversation_id is None:
        return None
    sender = _dict(_dict(conversation.get("meta")).get("sender"))
    phone = sender.get("phone_number")
    if not isinstance(phone, str) or not PHONE_RE.fullmatch(phone):
        return None
    source_id = _dict(conversation.get("contact_inbox")).get("source_id")
    return AgentReply(
        message_id=message_id,
        conversation_id=conversation_id,
        content=content[:4096],
        phone=phone,
        source_id=source_id if isinstance(source_id, str) else "",
    )
