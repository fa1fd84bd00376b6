"""A sandbox standing in for Chatwoot's application API (v1), for tests and the demo.

It answers, under ``/api/v1/accounts/{account_id}``, exactly what the mirror uses, with Chatwoot's
JSON shapes: ``GET /contacts/search?q=``, ``POST /contacts``, ``GET /contacts/{id}/conversations``,
``POST /conversations`` (with its first ``message``, as Chatwoot's) and
``POST /conversations/{id}/messages``. The ``api_access_token`` header
must be the account's token (401 otherwise, as Chatwoot answers); unknown contacts, conversations
and inboxes are 404. Contacts, conversations and messages live in memory.

Test controls (methods, safe from any thread): :meth:`ChatwootSandbox.fail_next` makes the next
requests fail with an HTTP status, :meth:`~ChatwootSandbox.set_latency` slows every answer,
:meth:`~ChatwootSandbox.messages`, :meth:`~ChatwootSandbox.contacts`,
:meth:`~ChatwootSandbox.conversations` and :meth:`~ChatwootSandbox.requests` show what was
stored and asked, :meth:`~ChatwootSandbox.reset` forgets it all::

    with ChatwootSandbox(accounts={1: "tok"}) as server:
        httpx.get(f"{server.url}/api/v1/accounts/1/contacts/search", params={"q": "+55..."},
                  headers={"api_access_token": "tok"})
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from project.sandboxes.server import ThreadedAppServer

logger = logging.getLogger(__name__)

T = TypeVar("T")

E164_RE = re.compile(r"\+[1-9]\d{1,14}")
MESSAGE_TYPES = {"incoming": 0, "outgoing": 1, "activity": 2, "template": 3}
# Chatwoot's wording for the errors it answers.
UNAUTHORIZED = "Invalid Access Token"
NOT_YOUR_ACCOUNT = "You are not authorized to access this account"
NOT_FOUND = "Resource could not be found"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Set by a handler that stores a message (lose_next_answers drops its answer).
CREATES_MESSAGE = web.RequestKey("creates_message", bool)


def _json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(payload, ensure_ascii=False).encode(), status=status, content_type="application/json"
    )


class ChatwootError(Exception):
    """An error answer; :meth:`response` renders it like Chatwoot."""

    def __init__(self, status: int, message: str, *, attributes: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.attributes = attributes

    def response(self) -> web.Response:
        if self.status == 422:
            # Validation errors come as {"message", "attributes"}; the rest as {"error"}.
            return _json_response({"message": self.message, "attributes": self.attributes or []}, 422)
        return _json_response({"error": self.message}, self.status)


@dataclass
class _State:
    """Everything a reset forgets; only ever touched on the server's event loop."""

    contacts: dict[int, dict[str, Any]] = field(default_factory=dict)
    # (contact_id, inbox_id) -> source_id
    contact_inboxes: dict[tuple[int, int], str] = field(default_factory=dict)
    # (account_id, display_id) -> conversation
    conversations: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    fail_after: int = 0
    fail_count: int = 0
    fail_status: int = 500
    lose_answers: int = 0  # message creations to take and then hang up on, unanswered
    contact_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    message_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    display_ids: dict[int, itertools.count[int]] = field(default_factory=dict)


class ChatwootSandbox(ThreadedAppServer):
    """The sandbox as an aiohttp app running on its own event loop in a daemon thread.

    ``accounts`` maps account_id -> api access token. ``inboxes`` maps inbox_id -> account_id;
    when it is None every inbox id is an API-channel inbox of whichever account asks.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        accounts: Mapping[int, str] | None = None,
        inboxes: Mapping[int, int] | None = None,
        *,
        latency_ms: float = 0.0,
    ) -> None:
        super().__init__(host, port)
        self._accounts = {int(k): v for k, v in (accounts or {}).items()}
        self._tokens = frozenset(self._accounts.values())
        self._inboxes = None if inboxes is None else {int(k): int(v) for k, v in inboxes.items()}
        self._latency_ms = float(latency_ms)
        self._state = _State()

    # -- lifecycle ------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        """The aiohttp application: the eight API routes, behind the request log and fault injection."""
        app = web.Application(middlewares=[self._middleware])
        base = "/api/v1/accounts/{account_id:\\d+}"
        app.router.add_get(base + "/contacts/search", self._handle_contact_search)
        app.router.add_post(base + "/contacts", self._handle_contact_create)
        app.router.add_get(
            base + "/contacts/{contact_id:\\d+}/conversations", self._handle_contact_conversations
        )
        app.router.add_post(base + "/conversations", self._handle_conversation_create)
        app.router.add_post(
            base + "/conversations/{conversation_id:\\d+}/messages", self._handle_message_create
        )
        app.router.add_post(
            base + "/conversations/{conversation_id:\\d+}/toggle_status", self._handle_conversation_status
        )
        app.router.add_post(
            base + "/conversations/{conversation_id:\\d+}/assignments", self._handle_conversation_assign
        )
        app.router.add_get(base + "/conversations/{conversation_id:\\d+}/messages", self._handle_message_list)
        app.router.add_get("/_sandbox/conversations", self._handle_sandbox_conversations)
        app.router.add_get("/_sandbox/messages", self._handle_sandbox_messages)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown)
        return app

    thread_name = "chatwoot-sandbox"

    async def _handle_sandbox_conversations(self, request: web.Request) -> web.Response:
        """What an agent would see (the demo's window into the sandbox): every conversation with its
        contact and its messages in order."""
        messages = self._state.messages
        return _json_response(
            {
                "conversations": [
                    {
                        **self._conversation_json(c),
                        "messages": [
                            {k: m[k] for k in ("id", "content", "message_type", "private", "created_at")}
                            for m in messages
                            if m["conversation_id"] == c["id"]
                        ],
                    }
                    for c in self._state.conversations.values()
                ]
            }
        )

    async def _handle_sandbox_messages(self, request: web.Request) -> web.Response:
        """The messages stored after id `after` (default 0), in order, each with `received_at` (when
        the sandbox took it, epoch seconds): for a process that watches a sandbox running in
        another (a benchmark), at a cost proportional to what is new."""
        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            raise ChatwootError(400, "after must be a message id") from None
        messages = self._state.messages
        start = len(messages)
        while start > 0 and messages[start - 1]["id"] > after:  # ids grow with the list
            start -= 1
        fields = ("id", "conversation_id", "phone", "content", "message_type", "private", "received_at")
        return _json_response({"messages": [{k: m[k] for k in fields} for m in messages[start:]]})

    # -- thread-safe controls -------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 500, *, after: int = 0) -> None:
        """Let ``after`` requests through, then answer the next ``n`` with HTTP ``status``."""
        if n < 0 or after < 0 or not 400 <= status <= 599:
            raise ValueError("n and after must be >= 0 and status an HTTP error status (400-599)")

        def apply() -> None:
            self._state.fail_after, self._state.fail_count, self._state.fail_status = after, n, status

        self._on_loop(apply)

    def lose_next_answers(self, n: int) -> None:
        """Take the next ``n`` message creations (a conversation created with its first message
        too), then close the connection without an answer."""

        def apply() -> None:
            self._state.lose_answers = n

        self._on_loop(apply)

    def set_latency(self, ms: float) -> None:
        """Delay every answer by ``ms`` milliseconds (to make a client time out)."""
        self._latency_ms = max(float(ms), 0.0)

    def messages(self) -> list[dict[str, Any]]:
        """Stored messages in order (copies): id, conversation_id, contact_id, phone, content, private..."""
        return self._on_loop(lambda: [dict(m) for m in self._state.messages])

    def contacts(self) -> list[dict[str, Any]]:
        """Stored contacts in order (copies, as the API renders them)."""
        return self._on_loop(lambda: [self._contact_json(c) for c in self._state.contacts.values()])

    def conversations(self) -> list[dict[str, Any]]:
        """Stored conversations in order (copies, as the API renders them)."""
        return self._on_loop(lambda: [self._conversation_json(c) for c in self._state.conversations.values()])

    def requests(self) -> list[dict[str, Any]]:
        """Every request received, in order: method, path, status answered."""
        return self._on_loop(lambda: [dict(r) for r in self._state.requests])

    def create_contact(self, account_id: int, phone_e164: str, name: str = "") -> int:
        """Store a contact directly (no inbox), as if an agent had added it; returns its id."""
        return self._on_loop(lambda: self._new_contact(int(account_id), phone_e164, name)["id"])

    def reset(self) -> None:
        """Forget contacts, conversations, messages, the request log and pending failures."""

        def clear() -> None:
            self._state = _State()

        self._on_loop(clear)

    # -- request pipeline (event loop only) -----------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._latency_ms > 0:
            await asyncio.sleep(self._latency_ms / 1000)
        state = self._state
        entry: dict[str, Any] = {"method": request.method, "path": request.path, "status": None}
        state.requests.append(entry)
        response: web.StreamResponse
        if state.fail_count > 0 and state.fail_after == 0:
            state.fail_count -= 1
            response = _json_response({"error": "sandbox: scripted failure"}, state.fail_status)
        else:
            if state.fail_after > 0:
                state.fail_after -= 1
            try:
                account_id = int(request.match_info.get("account_id", "0"))
                if account_id:
                    self._check_token(account_id, request.headers.get("api_access_token", ""))
                response = await handler(request)
            except ChatwootError as error:
                response = error.response()
        entry["status"] = response.status
        if state.lose_answers > 0 and request.get(CREATES_MESSAGE) and response.status < 300:
            state.lose_answers -= 1
            entry["status"] = "lost"
            if request.transport is not None:
                request.transport.close()  # the message is kept; its answer never reaches the client
        return response

    def _check_token(self, account_id: int, token: str) -> None:
        if not token or token not in self._tokens:
            raise ChatwootError(401, UNAUTHORIZED)
        if self._accounts.get(account_id) != token:
            raise ChatwootError(401, NOT_YOUR_ACCOUNT)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            data = json.loads(await request.read() or b"{}")
        except ValueError:
            raise ChatwootError(400, "the body must be JSON") from None
        if not isinstance(data, dict):
            raise ChatwootError(400, "the body must be a JSON object")
        return data

    def _check_inbox(self, account_id: int, inbox_id: Any) -> int:
        try:
            inbox = int(inbox_id)
        except (TypeError, ValueError):
            raise ChatwootError(404, NOT_FOUND) from None
        if inbox <= 0 or (self._inboxes is not None and self._inboxes.get(inbox) != account_id):
            raise ChatwootError(404, NOT_FOUND)
        return inbox

    def _contact(self, account_id: int, contact_id: Any) -> dict[str, Any]:
        try:
            contact = self._state.contacts.get(int(contact_id))
        except (TypeError, ValueError):
            contact = None
        if contact is None or contact["account_id"] != account_id:
            raise ChatwootError(404, NOT_FOUND)
        return contact

    # -- JSON renderings ------------------------------------------------------------------------

    def _contact_json(self, contact: dict[str, Any]) -> dict[str, Any]:
        inboxes = [
            {
                "source_id": source_id,
                "inbox": {"id": inbox_id, "name": f"API inbox {inbox_id}", "channel_type": "Channel::Api"},
            }
            for (contact_id, inbox_id), source_id in self._state.contact_inboxes.items()
            if contact_id == contact["id"]
        ]
        return {
            "additional_attributes": {},
            "availability_status": "offline",
            "email": None,
            "id": contact["id"],
            "name": contact["name"],
            "phone_number": contact["phone_number"],
            "blocked": False,
            "identifier": None,
            "thumbnail": "",
            "custom_attributes": {},
            "last_activity_at": None,
            "created_at": contact["created_at"],
            "contact_inboxes": inboxes,
        }

    def _conversation_json(self, conversation: dict[str, Any]) -> dict[str, Any]:
        contact = self._state.contacts[conversation["contact_id"]]
        return {
            "id": conversation["id"],
            "account_id": conversation["account_id"],
            "inbox_id": conversation["inbox_id"],
            "uuid": conversation["uuid"],
            "status": conversation["status"],
            "contact_inbox": {"source_id": conversation["source_id"]},
            "meta": {
                "sender": {
                    "id": contact["id"],
                    "name": contact["name"],
                    "phone_number": contact["phone_number"],
                },
                "channel": "Channel::Api",
                "assignee": (
                    {"id": conversation["assignee_id"]} if conversation.get("assignee_id") else None
                ),
                "team": {"id": conversation["team_id"]} if conversation.get("team_id") else None,
            },
            # Chatwoot's conversation partial: the latest message, whatever its kind.
            "messages": [self._message_json(m) for m in self._latest_message(conversation)],
            "unread_count": 0,
            "created_at": conversation["created_at"],
            "timestamp": conversation["created_at"],
        }

    def _latest_message(self, conversation: dict[str, Any]) -> list[dict[str, Any]]:
        for message in reversed(self._state.messages):
            if (
                message["conversation_id"] == conversation["id"]
                and message["account_id"] == conversation["account_id"]
            ):
                return [message]
        return []

    def _new_contact(self, account_id: int, phone: str, name: str) -> dict[str, Any]:
        if not E164_RE.fullmatch(phone):
            raise ChatwootError(422, "Phone number should be in e164 format", attributes=["phone_number"])
        if any(
            c["phone_number"] == phone and c["account_id"] == account_id
            for c in self._state.contacts.values()
        ):
            raise ChatwootError(422, "Phone number has already been taken", attributes=["phone_number"])
        contact: dict[str, Any] = {
            "id": next(self._state.contact_ids),
            "account_id": account_id,
            "name": name or phone,
            "phone_number": phone,
            "created_at": int(time.time()),
        }
        self._state.contacts[contact["id"]] = contact
        return contact

    # -- API handlers (event loop only) ---------------------------------------------------------

    async def _handle_contact_search(self, request: web.Request) -> web.Response:
        account_id = int(request.match_info["account_id"])
        q = request.query.get("q", "").strip()
        if not q:
            raise ChatwootError(422, "Specify search string with parameter q")
        needle = q.lower()
        found = [
            self._contact_json(c)
            for c in self._state.contacts.values()
            if c["account_id"] == account_id
            and (needle in c["phone_number"].lower() or needle in (c["name"] or "").lower())
        ]
        return _json_response({"meta": {"count": len(found), "current_page": 1}, "payload": found})

    async def _handle_contact_create(self, request: web.Request) -> web.Response:
        account_id = int(request.match_info["account_id"])
        data = await self._body(request)
        inbox_id = self._check_inbox(account_id, data.get("inbox_id")) if data.get("inbox_id") else None
        contact = self._new_contact(
            account_id, str(data.get("phone_number") or ""), str(data.get("name") or "")
        )
        contact_inbox: dict[str, Any] = {"inbox": None, "source_id": None}
        if inbox_id is not None:
            source_id = str(uuid.uuid4())
            self._state.contact_inboxes[(contact["id"], inbox_id)] = source_id
            contact_inbox = {
                "inbox": {"id": inbox_id, "name": f"API inbox {inbox_id}", "channel_type": "Channel::Api"},
                "source_id": source_id,
            }
        return _json_response(
            {"payload": {"contact": self._contact_json(contact), "contact_inbox": contact_inbox}}
        )

    async def _handle_contact_conversations(self, request: web.Request) -> web.Response:
        account_id = int(request.match_info["account_id"])
        contact = self._contact(account_id, request.match_info["contact_id"])
        found = [
            self._conversation_json(c)
            for c in self._state.conversations.values()
            if c["account_id"] == account_id and c["contact_id"] == contact["id"]
        ]
        return _json_response({"payload": found})

    async def _handle_conversation_create(self, request: web.Request) -> web.Response:
        """As Chatwoot's ConversationsController#create: the conversation, and with a `message`
        its first message (MessageBuilder, as POST .../messages reads it), in one transaction:
        a message refused creates no conversation either."""
        account_id = int(request.match_info["account_id"])
        data = await self._body(request)
        first = data.get("message")
        if first:
            if not isinstance(first, dict):
                raise ChatwootError(400, "message must be a JSON object")
            self._message_fields(first)  # refused before anything is created
            request[CREATES_MESSAGE] = True
        source_id = data.get("source_id")
        if data.get("contact_id") and data.get("inbox_id"):
            contact = self._contact(account_id, data["contact_id"])
            inbox_id = self._check_inbox(account_id, data["inbox_id"])
            key = (contact["id"], inbox_id)
            # As Chatwoot's ContactInboxBuilder: reuse the contact's entry in the inbox, else make one.
            source_id = self._state.contact_inboxes.setdefault(key, str(source_id or uuid.uuid4()))
        elif source_id:
            match = [k for k, v in self._state.contact_inboxes.items() if v == source_id]
            if not match:
                raise ChatwootError(404, NOT_FOUND)
            contact = self._contact(account_id, match[0][0])
            inbox_id = match[0][1]
        else:
            raise ChatwootError(404, NOT_FOUND)
        counter = self._state.display_ids.setdefault(account_id, itertools.count(1))
        display_id = next(counter)
        conversation = {
            "id": display_id,
            "account_id": account_id,
            "inbox_id": inbox_id,
            "contact_id": contact["id"],
            "source_id": source_id,
            "uuid": str(uuid.uuid4()),
            "status": "open",
            "created_at": int(time.time()),
        }
        self._state.conversations[(account_id, display_id)] = conversation
        if first:
            self._new_message(account_id, conversation, first)
        return _json_response(self._conversation_json(conversation))

    def _conversation_of(self, request: web.Request) -> dict[str, Any]:
        account_id = int(request.match_info["account_id"])
        conversation = self._state.conversations.get((account_id, int(request.match_info["conversation_id"])))
        if conversation is None:
            raise ChatwootError(404, NOT_FOUND)
        return conversation

    async def _handle_conversation_status(self, request: web.Request) -> web.Response:
        conversation = self._conversation_of(request)
        status = (await self._body(request)).get("status")
        if status not in ("open", "pending", "resolved", "snoozed"):
            raise ChatwootError(422, f"'{status}' is not a valid status", attributes=["status"])
        conversation["status"] = status
        return _json_response(
            {
                "meta": {},
                "payload": {"success": True, "current_status": status, "conversation_id": conversation["id"]},
            }
        )

    async def _handle_conversation_assign(self, request: web.Request) -> web.Response:
        conversation = self._conversation_of(request)
        data = await self._body(request)
        for key in ("assignee_id", "team_id"):
            if key in data:
                conversation[key] = int(data[key]) if data[key] else None
        return _json_response({"id": conversation.get("assignee_id") or conversation.get("team_id")})

    async def _handle_message_create(self, request: web.Request) -> web.Response:
        account_id = int(request.match_info["account_id"])
        conversation = self._state.conversations.get((account_id, int(request.match_info["conversation_id"])))
        if conversation is None:
            raise ChatwootError(404, NOT_FOUND)
        request[CREATES_MESSAGE] = True
        message = self._new_message(account_id, conversation, await self._body(request))
        return _json_response(
            {
                **self._message_json(message),
                "status": "sent",
                "source_id": None,
                "sender": {"id": 1, "name": "Agent", "type": "user"},
            }
        )

    @staticmethod
    def _message_fields(data: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
        """(content, message_type, content_attributes) of a message's body, or Chatwoot's 422."""
        content = data.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ChatwootError(422, "Content can't be blank", attributes=["content"])
        kind = data.get("message_type", "outgoing")
        message_type = kind if isinstance(kind, int) else MESSAGE_TYPES.get(str(kind))
        if message_type is None or message_type not in MESSAGE_TYPES.values():
            raise ChatwootError(422, f"'{kind}' is not a valid message_type", attributes=["message_type"])
        attributes = data.get("content_attributes") or {}
        return content, message_type, attributes if isinstance(attributes, dict) else {}

    def _new_message(
        self, account_id: int, conversation: dict[str, Any], data: dict[str, Any]
    ) -> dict[str, Any]:
        content, message_type, attributes = self._message_fields(data)
        contact = self._state.contacts[conversation["contact_id"]]
        message = {
            "id": next(self._state.message_ids),
            "account_id": account_id,
            "inbox_id": conversation["inbox_id"],
            "conversation_id": conversation["id"],
            "contact_id": contact["id"],
            "phone": contact["phone_number"],
            "content": content,
            "message_type": message_type,
            "private": bool(data.get("private", False)),
            "content_attributes": attributes,
            "created_at": int(time.time()),
            "received_at": time.time(),  # the sandbox's own: when it took the message (benchmarks)
        }
        self._state.messages.append(message)
        return message

    @staticmethod
    def _message_json(message: dict[str, Any]) -> dict[str, Any]:
        """A message as Chatwoot renders it (push_event_data's fields the clients read)."""
        return {
            "id": message["id"],
            "content": message["content"],
            "account_id": message["account_id"],
            "inbox_id": message["inbox_id"],
            "conversation_id": message["conversation_id"],
            "message_type": message["message_type"],
            "content_type": "text",
            "content_attributes": message["content_attributes"],
            "created_at": message["created_at"],
            "private": message["private"],
        }

    async def _handle_message_list(self, request: web.Request) -> web.Response:
        """The conversation's latest 20 messages, oldest first (Chatwoot's page without `before`)."""
        account_id = int(request.match_info["account_id"])
        conversation = self._state.conversations.get((account_id, int(request.match_info["conversation_id"])))
        if conversation is None:
            raise ChatwootError(404, NOT_FOUND)
        mine = [m for m in self._state.messages if m["conversation_id"] == conversation["id"]][-20:]
        return _json_response({"meta": {}, "payload": mine})

    async def _handle_unknown(self, request: web.Request) -> web.Response:
        raise ChatwootError(404, NOT_FOUND)
