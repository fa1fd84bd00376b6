"""One message posted to its customer's Chatwoot conversation (messaging.chatwoot_inbound pushes
them): the conversation kept from earlier, or the contact and conversation found or created — a new
contact's conversation created with the message as its first —, a post whose last answer was lost
looked for before it is made again, and a flow's handoff as a private note that opens and assigns
the conversation."""

from __future__ import annotations

import json
from typing import Any

from integrations.chatwoot.client import ChatwootClient
from integrations.errors import IntegrationError
from integrations.models import ChatwootAccount
from messaging.models import ConversationMessage

HANDOFF_KIND = "handoff"
MAYBE_DELIVERED = "maybe delivered: "  # a row's error when Chatwoot may have it (its answer was lost)
Thread = tuple[int, int]  # Chatwoot's (contact id, conversation id) of a customer in an inbox


def chatwoot_content(row: ConversationMessage) -> str:
    """What the agent reads: the text, or the type and what Meta gave of a media message."""
    if row.media_id:
        detail = " ".join(x for x in (row.media_filename, row.media_mime) if x)
        label = f"[{row.kind}{': ' + detail if detail else ''}]"
        return f"{label} {row.text}".strip()
    if row.kind not in ("text", "button", "interactive"):
        return f"[{row.kind}] {row.text}".strip()
    return row.text or f"[{row.kind}]"


def deliver(
    client: ChatwootClient,
    account: ChatwootAccount,
    row: ConversationMessage,
    known: dict[tuple[int, int], Thread],
    found: dict[tuple[int, int], Thread],
) -> int:
    """Post the row to its customer's conversation; returns Chatwoot's message id. The conversation
    kept from earlier costs nothing more; one Chatwoot no longer has (404) is looked up again."""
    inbox_id = (row.store.chatwoot_inbox_id if row.store is not None else None) or account.inbox_id
    key = (row.customer_id, inbox_id)
    thread = found.get(key) or known.get(key)
    if thread is not None:
        try:
            return _post(client, account, row, thread[1])
        except IntegrationError as exc:
            if exc.status != 404 or key in found:
                raise
    return _post_to_new_thread(client, account, row, inbox_id, found)


def _post_to_new_thread(
    client: ChatwootClient,
    account: ChatwootAccount,
    row: ConversationMessage,
    inbox_id: int,
    found: dict[tuple[int, int], Thread],
) -> int:
    """The customer's contact and conversation in the inbox, found or created, and the row posted
    to it. A new contact is created at once (a phone Chatwoot already has is then searched for);
    having no conversation yet, it gets one created with the row as its first message: two calls.
    A handoff (a note, then open and assign) goes through `_post`."""
    phone = row.customer.phone
    contact_id, source_id, created = client.contact_create_or_find(
        phone_e164=phone, name=row.customer.name, inbox_id=inbox_id
    )
    source_id = source_id or phone.lstrip("+")
    if created and row.kind != HANDOFF_KIND:
        # A contact created just now holds nothing we posted earlier: no lookup for a lost answer.
        conversation_id, message_id = client.conversation_create_with_message(
            contact_id=contact_id, source_id=source_id, inbox_id=inbox_id, **_message_fields(account, row)
        )
        found[(row.customer_id, inbox_id)] = (contact_id, conversation_id)
        if message_id is None:  # the answer showed another message as the latest: ask for ours
            message_id = client.message_find(
                conversation_id=conversation_id, attribute="crm_message_id", value=row.pk
            )
        return message_id or 0
    if created:
        conversation_id = client.conversation_create(
            contact_id=contact_id, source_id=source_id, inbox_id=inbox_id
        )
    else:
        conversation_id = client.conversation_find_or_create(
            contact_id=contact_id, source_id=source_id, inbox_id=inbox_id
        )
    found[(row.customer_id, inbox_id)] = (contact_id, conversation_id)
    return _post(client, account, row, conversation_id)


def _message_fields(account: ChatwootAccount, row: ConversationMessage) -> dict[str, Any]:
    """The row as a Chatwoot message: content, type, private flag, and our attributes."""
    inbound = row.direction == row.Direction.INBOUND
    campaign = row.source == row.Source.CAMPAIGN
    attributes: dict[str, int] = {"crm_message_id": row.pk}  # what we posted: not an agent's reply
    if campaign and row.campaign_message_id is not None:
        attributes["campaign_message_id"] = row.campaign_message_id
    return {
        "content": chatwoot_content(row),
        # A campaign's copy is a private note for organizations that mirror into the WhatsApp
        # inbox's own conversations (an API-channel inbox never forwards an outgoing message).
        "private": campaign and account.mode == ChatwootAccount.Mode.PRIVATE_NOTE,
        "message_type": "incoming" if inbound else "outgoing",
        "content_attributes": attributes,
    }


def _post(
    client: ChatwootClient, account: ChatwootAccount, row: ConversationMessage, conversation_id: int
) -> int:
    if row.kind == HANDOFF_KIND:
        return _hand_over(client, conversation_id, row)
    if row.chatwoot_error.startswith(MAYBE_DELIVERED):
        # Its last post got no answer: Chatwoot may have it already (no second line for it).
        posted = client.message_find(
            conversation_id=conversation_id, attribute="crm_message_id", value=row.pk
        )
        if posted is not None:
            return posted
    return client.message_create(conversation_id=conversation_id, **_message_fields(account, row))


def _hand_over(client: ChatwootClient, conversation_id: int, row: ConversationMessage) -> int:
    """The note for the agents, then the conversation open (and assigned): a retry after a
    failure part-way posts the note again (a duplicate note beats a customer nobody picks up)."""
    note = client.message_create(
        conversation_id=conversation_id,
        content=row.text,
        private=True,
        content_attributes={"crm_message_id": row.pk},
    )
    client.conversation_open(conversation_id=conversation_id)
    try:
        assign = json.loads(row.payload or "{}")
    except ValueError:
        assign = {}
    client.conversation_assign(
        conversation_id=conversation_id, assignee_id=assign.get("assignee_id"), team_id=assign.get("team_id")
    )
    return note
