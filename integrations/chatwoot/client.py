"""Chatwoot application API (v1) client: plain values in, plain values out.

Only what mirroring a campaign message and handing a customer to an agent need: find or create a
contact, find or create its conversation in one inbox (a new one with its first message, in one
call), post a message (or a private note) to it, open it and assign it. Every failure is an IntegrationError
classified by integrations.retry: retryable for timeouts, network errors, 408/425/429 and 5xx
(with the answer's Retry-After); not for any other 4xx or a URL that can never work. A POST that
went out without an answer is `maybe_delivered` and still retryable: a mirror never reaches the
customer (an API inbox or a private note), so a duplicate line in Chatwoot beats a lost one.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx

from integrations import http
from integrations.errors import IntegrationError

# Chatwoot answers these for a conversation still open to the agent; a resolved one is reused
# only when there is nothing better, so a mirrored message lands where agents are looking.
_ACTIVE_STATUSES = ("open", "pending")


def _source_id_in(contact_inboxes: Any, inbox_id: int) -> str | None:
    """The source_id of the entry for `inbox_id` in a contact_inboxes list, if any."""
    if not isinstance(contact_inboxes, list):
        return None
    for entry in contact_inboxes:
        if not isinstance(entry, dict):
            continue
        inbox = entry.get("inbox")
        entry_inbox = inbox.get("id") if isinstance(inbox, dict) else entry.get("inbox_id")
        if entry_inbox == inbox_id and entry.get("source_id"):
            return str(entry["source_id"])
    return None


def parse_contact_create(body: Any, inbox_id: int) -> tuple[int, str | None]:
    """(contact_id, source_id) from a POST /contacts answer, in either shape Chatwoot has used.

    Current: {"payload": {"contact": {...}, "contact_inbox": {"source_id": ...}}}; older:
    {"payload": {"contact": {...}, "contact_inboxes": [...]}}. Raises a non-retryable
    IntegrationError when there is no contact id.
    """
    payload = body.get("payload") if isinstance(body, dict) else None
    contact = payload.get("contact") if isinstance(payload, dict) else None
    if not isinstance(payload, dict) or not isinstance(contact, dict) or "id" not in contact:
        raise IntegrationError("Chatwoot: unexpected answer to a contact creation", retryable=False)
    source_id: str | None = None
    contact_inbox = payload.get("contact_inbox")
    if isinstance(contact_inbox, dict) and contact_inbox.get("source_id"):
        source_id = str(contact_inbox["source_id"])
    source_id = (
        source_id
        or _source_id_in(payload.get("contact_inboxes"), inbox_id)
        or _source_id_in(contact.get("contact_inboxes"), inbox_id)
    )
    return int(contact["id"]), source_id


class ChatwootClient:
    """One Chatwoot account, authenticated by an agent or bot access token; use it as a context manager."""

    def __init__(
        self,
        *,
        base_url: str,
        account_id: int,
        api_token: str,
        timeout: httpx.Timeout | None = None,
        max_connections: int = 4,
    ) -> None:
        self._prefix = f"/api/v1/accounts/{int(account_id)}"
        self._http = http.client(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            headers={"api_access_token": api_token, "Accept": "application/json"},
            max_connections=max_connections,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ChatwootClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- operations --------------------------------------------------------------------------------

    def contact_find_or_create(self, *, phone_e164: str, name: str, inbox_id: int) -> tuple[int, str | None]:
        """(contact_id, source_id) of the contact with exactly this phone, created in `inbox_id` if none.

        source_id is None when the contact exists but has no entry in `inbox_id` yet (Chatwoot then
        creates one with the conversation).
        """
        found = self._search(phone_e164, inbox_id)
        if found is not None:
            return found
        # Another worker may create it between our search and our POST: the POST then finds it.
        contact_id, source_id, _ = self.contact_create_or_find(
            phone_e164=phone_e164, name=name, inbox_id=inbox_id
        )
        return contact_id, source_id

    def contact_create_or_find(
        self, *, phone_e164: str, name: str, inbox_id: int
    ) -> tuple[int, str | None, bool]:
        """(contact_id, source_id, created): the contact created in `inbox_id`, or, when Chatwoot
        says the phone is taken (422), the one with exactly this phone. For a caller that keeps the
        ids it found: a new contact costs one call instead of a search and a creation."""
        try:
            body = self._request(
                "POST",
                "/contacts",
                json={"inbox_id": inbox_id, "name": name or phone_e164, "phone_number": phone_e164},
            )
        except IntegrationError as exc:
            if exc.status == 422:
                found = self._search(phone_e164, inbox_id)
                if found is not None:
                    return (*found, False)
            raise
        return (*parse_contact_create(body, inbox_id), True)

    def conversation_create(self, *, contact_id: int, source_id: str | None, inbox_id: int) -> int:
        """The id of a new conversation of the contact in `inbox_id`."""
        created = self._request(
            "POST", "/conversations", json=_conversation_body(contact_id, source_id, inbox_id)
        )
        if not isinstance(created, dict) or "id" not in created:
            raise IntegrationError("Chatwoot: unexpected answer to a conversation creation", retryable=False)
        return int(created["id"])

    def conversation_create_with_message(
        self,
        *,
        contact_id: int,
        source_id: str | None,
        inbox_id: int,
        content: str,
        private: bool,
        content_attributes: Mapping[str, Any] | None = None,
        message_type: str = "outgoing",
    ) -> tuple[int, int | None]:
        """(conversation id, message id) of a new conversation of the contact in `inbox_id` created
        with its first message in one call (Chatwoot builds both in one transaction: both or
        neither). The message id is None when the answer's `messages` (the conversation's latest)
        is not this one; never retried here."""
        data = _conversation_body(contact_id, source_id, inbox_id)
        data["message"] = _message_body(content, private, content_attributes, message_type)
        created = self._request("POST", "/conversations", json=data)
        if not isinstance(created, dict) or "id" not in created:
            raise IntegrationError("Chatwoot: unexpected answer to a conversation creation", retryable=False)
        return int(created["id"]), _message_id_in(created.get("messages"), data["message"])

    def conversation_find_or_create(self, *, contact_id: int, source_id: str | None, inbox_id: int) -> int:
        """The id of the contact's conversation in `inbox_id` (open or pending first), created if none."""
        body = self._request("GET", f"/contacts/{int(contact_id)}/conversations")
        conversations = [
            c
            for c in (body.get("payload") if isinstance(body, dict) else None) or []
            if isinstance(c, dict) and c.get("inbox_id") == inbox_id and "id" in c
        ]
        if conversations:
            active = [c for c in conversations if c.get("status") in _ACTIVE_STATUSES]
            return int(max(active or conversations, key=lambda c: int(c["id"]))["id"])
        return self.conversation_create(contact_id=contact_id, source_id=source_id, inbox_id=inbox_id)

    def message_create(
        self,
        *,
        conversation_id: int,
        content: str,
        private: bool,
        content_attributes: Mapping[str, Any] | None = None,
        message_type: str = "outgoing",
    ) -> int:
        """The id of a new message (outgoing, a private note, or "incoming": what the contact sent)
        in the conversation; never retried here."""
        body = self._request(
            "POST",
            f"/conversations/{int(conversation_id)}/messages",
            json=_message_body(content, private, content_attributes, message_type),
        )
        if not isinstance(body, dict) or "id" not in body:
            raise IntegrationError("Chatwoot: unexpected answer to a message creation", retryable=False)
        return int(body["id"])

    def conversation_open(self, *, conversation_id: int) -> None:
        """Set the conversation's status to open (the agents' queue), whatever it was; idempotent."""
        self._request("POST", f"/conversations/{int(conversation_id)}/toggle_status", json={"status": "open"})

    def conversation_assign(
        self, *, conversation_id: int, assignee_id: int | None = None, team_id: int | None = None
    ) -> None:
        """Assign the conversation to an agent and/or a team; idempotent (nothing asked: no call)."""
        data = {k: int(v) for k, v in (("assignee_id", assignee_id), ("team_id", team_id)) if v is not None}
        if data:
            self._request("POST", f"/conversations/{int(conversation_id)}/assignments", json=data)

    def message_find(self, *, conversation_id: int, attribute: str, value: int) -> int | None:
        """The id of one of the conversation's latest messages whose content_attributes has
        `attribute` = `value` (a message posted earlier whose answer never came back), else None."""
        body = self._request("GET", f"/conversations/{int(conversation_id)}/messages")
        for message in (body.get("payload") if isinstance(body, dict) else None) or []:
            attributes = message.get("content_attributes") if isinstance(message, dict) else None
            if isinstance(attributes, dict) and attributes.get(attribute) == value and "id" in message:
                return int(message["id"])
        return None

    # -- plumbing ----------------------------------------------------------------------------------

    def _search(self, phone_e164: str, inbox_id: int) -> tuple[int, str | None] | None:
        body = self._request("GET", "/contacts/search", params={"q": phone_e164})
        # The search matches substrings of name, email and phone: keep only the exact phone.
        for contact in (body.get("payload") if isinstance(body, dict) else None) or []:
            if isinstance(contact, dict) and contact.get("phone_number") == phone_e164 and "id" in contact:
                return int(contact["id"]), _source_id_in(contact.get("contact_inboxes"), inbox_id)
        return None

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Mapping[str, Any] | None = None,
    ) -> Any:
        """The decoded JSON answer of a 2xx, or an IntegrationError saying whether to retry."""
        what = f"Chatwoot {method} {path}"
        try:
            response = self._http.request(method, self._prefix + path, params=params, json=json)
        except httpx.TransportError as exc:
            raise http.no_answer_error(what, exc, idempotent=method == "GET") from exc
        status = response.status_code
        if status >= 400:
            raise http.status_error(what, response, details=_error_text(response))
        try:
            return response.json()
        except ValueError as exc:
            raise IntegrationError(
                f"{what}: HTTP {status} with a body that is not JSON", retryable=False, status=status
            ) from exc


def _conversation_body(contact_id: int, source_id: str | None, inbox_id: int) -> dict[str, Any]:
    data: dict[str, Any] = {"inbox_id": inbox_id, "contact_id": contact_id}
    if source_id:
        data["source_id"] = source_id
    return data


def _message_body(
    content: str, private: bool, content_attributes: Mapping[str, Any] | None, message_type: str
) -> dict[str, Any]:
    """A message as Chatwoot's MessageBuilder reads it, alone or as a new conversation's `message`."""
    return {
        "content": content,
        "message_type": message_type,
        "private": private,
        "content_attributes": dict(content_attributes or {}),
    }


def _message_id_in(messages: Any, sent: Mapping[str, Any]) -> int | None:
    """The id of the message in a conversation's answer (`messages`: its latest) that is the one
    sent: same content, and its content_attributes hold what was sent."""
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict) or "id" not in message or message.get("content") != sent["content"]:
            continue
        attributes = message.get("content_attributes")
        attributes = attributes if isinstance(attributes, dict) else {}
        if all(attributes.get(k) == v for k, v in sent["content_attributes"].items()):
            return int(message["id"])
    return None


def _error_text(response: httpx.Response) -> str:
    """Chatwoot's own words for an error ({"error": ...} or {"message": ...}), else the body's start."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        for key in ("error", "message", "errors"):
            if body.get(key):
                return str(body[key])[:300]
    return str(body)[:300]
