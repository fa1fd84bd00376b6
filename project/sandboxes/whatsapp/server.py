"""The sandbox server: an aiohttp app on its own event loop in a daemon thread (see the package)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
from collections.abc import Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from project.sandboxes.whatsapp.base import _bearer_token, _State
from project.sandboxes.whatsapp.callbacks import StatusWebhooks
from project.sandboxes.whatsapp.graph_errors import GraphError, _dumps, _json_response
from project.sandboxes.whatsapp.rules import Rule
from project.sandboxes.whatsapp.templates import templates_page
from project.sandboxes.whatsapp.validation import VERSION_RE, validate_message

logger = logging.getLogger(__name__)


class SandboxServer(StatusWebhooks):
    """The sandbox as an aiohttp app running on its own event loop in a daemon thread.

    ``numbers`` maps phone_number_id -> token; a token in ``tokens`` is accepted for any
    phone_number_id; with neither, any non-empty token is accepted. The public methods are safe to
    call from any thread while the server runs: they execute on the server's loop.
    """

    # -- lifecycle ------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        """The aiohttp application (routes only; start() also opens the webhook client session)."""
        app = web.Application(client_max_size=1024**2)
        app.router.add_post("/{version}/{phone_number_id}/messages", self._handle_send)
        app.router.add_get("/{version}/{waba_id}/message_templates", self._handle_templates)
        app.router.add_route("*", "/_sandbox/rules", self._handle_rules)
        app.router.add_route("*", "/_sandbox/config", self._handle_config)
        app.router.add_route("*", "/_sandbox/messages", self._handle_messages)
        app.router.add_get("/_sandbox/stats", self._handle_stats)
        app.router.add_post("/_sandbox/inbound", self._handle_inbound)
        app.router.add_get("/_sandbox/media/{media_id}", self._handle_media_bytes)
        app.router.add_get("/{version}/{media_id}", self._handle_media)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown)
        return app

    thread_name = "whatsapp-sandbox"
    # A deep backlog so a burst of 1,000+ connections is queued, not refused or SYN-retried.
    backlog = 4096

    def before_start(self) -> None:
        _raise_fd_limit()

    async def on_startup(self) -> None:
        # One shared client session for every webhook POST; its pool bounds concurrent callbacks.
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=60),  # a loaded web server still gets its callbacks
            connector=aiohttp.TCPConnector(limit=200),
            headers={"User-Agent": "facebookexternalua"},
        )

    async def on_shutdown(self) -> None:
        tasks = list(self._webhook_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def on_closed(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- thread-safe helpers --------------------------------------------------------------------

    def add_rule(
        self,
        to: str,
        code: int | None = None,
        *,
        http_status: int | None = None,
        times: int | None = None,
        webhook_failure_code: int | None = None,
        error_subcode: int | None = None,
        retry_after: int | None = None,
        hang_up: bool = False,
    ) -> dict[str, Any]:
        """Script failures for ``to`` (or ``"*"``); returns the stored rule. ``times=None`` = always."""
        rule = Rule.parse(
            {
                "to": to,
                "code": code,
                "http_status": http_status,
                "times": times,
                "webhook_failure_code": webhook_failure_code,
                "error_subcode": error_subcode,
                "retry_after": retry_after,
                "hang_up": hang_up,
            }
        )
        return self._on_loop(lambda: self._add_rule(rule))

    def clear_rules(self) -> None:
        """Forget every rule."""
        self._on_loop(self._rules.clear)

    def rules(self) -> list[dict[str, Any]]:
        """The rules still active, with their remaining ``times``."""
        return self._on_loop(self._rule_list)

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Change config keys (see :class:`SandboxConfig`); returns the whole config, secret masked."""

        def apply() -> dict[str, Any]:
            self._update_config(changes)
            return self.config.public()

        return self._on_loop(apply)

    def messages(self, to: str | None = None) -> list[dict[str, Any]]:
        """Accepted sends in order (copies), optionally only those to ``to`` (digits or wa_id)."""
        return self._on_loop(lambda: self._message_list(to))

    def stats(self) -> dict[str, int]:
        """Counters: accepted, rejected, by_recipient_max, webhooks_delivered, webhooks_failed,
        in_flight, in_flight_max, webhooks_pending."""
        return self._on_loop(self._stats)

    def reset(self) -> None:
        """Forget messages, stats and rules (configuration is kept)."""

        def clear() -> None:
            self._state = _State()
            self._rules.clear()

        self._on_loop(clear)

    # -- state (event loop only) ----------------------------------------------------------------

    def _add_rule(self, rule: Rule) -> dict[str, Any]:
        self._rules.setdefault(rule.to, []).append(rule)
        return asdict(rule)

    def _rule_list(self) -> list[dict[str, Any]]:
        return [asdict(rule) for rules in self._rules.values() for rule in rules]

    def _take_rule(self, digits: str) -> Rule | None:
        """The first rule for ``digits`` (else for ``"*"``), with one of its ``times`` used up."""
        for key in (digits, "*"):
            rules = self._rules.get(key)
            if not rules:
                continue
            rule = rules[0]
            if rule.times is not None:
                rule.times -= 1
                if rule.times <= 0:
                    rules.pop(0)
                    if not rules:
                        del self._rules[key]
            return rule
        return None

    def _message_list(self, to: str | None) -> list[dict[str, Any]]:
        records = self._state.messages
        if to:
            digits = to.lstrip("+")
            records = [m for m in records if m["wa_id"] == digits or m["to"].lstrip("+") == digits]
        return [dict(m) for m in records]

    def _stats(self) -> dict[str, int]:
        state = self._state
        return {
            "accepted": state.accepted,
            "rejected": state.rejected,
            "by_recipient_max": state.by_recipient_max,
            "webhooks_delivered": state.webhooks_delivered,
            "webhooks_failed": state.webhooks_failed,
            "in_flight": self._in_flight,
            "webhooks_pending": len(self._webhook_tasks),
            "in_flight_max": state.in_flight_max,
        }

    def _update_config(self, changes: Mapping[str, Any]) -> None:
        self.config.update(changes)
        if self._config_changed is not None:  # wake the waits, which re-read their delay
            self._config_changed.set()
            self._config_changed = None

    def _check_token(self, phone_number_id: str, token: str) -> None:
        """Raise the Graph error for a token that may not send from ``phone_number_id``."""
        if token and (
            self._numbers.get(phone_number_id) == token
            or token in self._tokens
            or (not self._numbers and not self._tokens)
        ):
            return
        if token in self._number_tokens:
            # A real token, but not for this number: Graph cannot see the object.
            raise GraphError(
                100,
                message=(
                    f"Unsupported post request. Object with ID '{phone_number_id}' does not exist, cannot be "
                    "loaded due to missing permissions, or does not support this operation."
                ),
                details=f"Phone number id {phone_number_id} is not available to this access token",
                error_subcode=33,
            )
        raise GraphError(190)

    def _accept(
        self, phone_number_id: str, to: str, template: dict[str, Any], payload: dict[str, Any]
    ) -> tuple[bool, bytes]:
        """Record a send (or raise the GraphError a rule scripts); returns whether a rule says to drop the
        connection instead of answering, and the 200 response body."""
        digits = to.lstrip("+")
        rule = self._take_rule(digits)
        if rule is not None and rule.rejects:
            raise rule.error()
        wa_id = self._wa_id(digits)
        wamid = self._new_wamid(wa_id)
        callback = payload.get("biz_opaque_callback_data")
        record = {
            "to": to,
            "wa_id": wa_id,
            "wamid": wamid,
            "phone_number_id": phone_number_id,
            "template": template,
            "biz_opaque_callback_data": callback,
            "received_at": datetime.now(UTC).isoformat(),
        }
        state = self._state
        state.messages.append(record)
        state.accepted += 1
        count = state.by_recipient.get(wa_id, 0) + 1
        state.by_recipient[wa_id] = count
        state.by_recipient_max = max(count, state.by_recipient_max)
        config = self.config
        if config.webhook_url and config.app_secret and config.status_delays_ms:
            failure = rule.webhook_failure_code if rule is not None else None
            task = asyncio.get_running_loop().create_task(
                self._deliver_statuses(record, failure, config.webhook_url, config.app_secret)
            )
            self._webhook_tasks.add(task)
            task.add_done_callback(self._webhook_tasks.discard)
        hang_up = rule is not None and rule.hang_up
        return hang_up, _dumps(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": to, "wa_id": wa_id}],
                "messages": [{"id": wamid, "message_status": "accepted"}],
            }
        )

    # -- Graph API ------------------------------------------------------------------------------

    async def _handle_send(self, request: web.Request) -> web.Response:
        # The whole request is received before Meta takes its time, so a client that stops waiting
        # (a read timeout) leaves a send that is still accepted, as it can be at Meta.
        raw = await request.read()
        arrived = asyncio.get_running_loop().time()
        self._in_flight += 1
        self._state.in_flight_max = max(self._state.in_flight_max, self._in_flight)
        try:
            # Sleeping (not blocking) so concurrent requests overlap, as they do against Meta.
            await self._wait_until(lambda: arrived + self.config.latency_ms / 1000)
        finally:
            self._in_flight -= 1
        version = request.match_info["version"]
        phone_number_id = request.match_info["phone_number_id"]
        try:
            if not VERSION_RE.fullmatch(version):
                raise GraphError(2500, message=f"Unknown path components: {request.path}")
            self._check_token(phone_number_id, _bearer_token(request))
            try:
                payload = json.loads(raw)
            except ValueError:
                raise GraphError(100, "The request body is not valid JSON") from None
            to, template = validate_message(payload)
            hang_up, body = self._accept(phone_number_id, to, template, payload)
        except GraphError as error:
            self._state.rejected += 1
            return error.response()
        if hang_up and request.transport is not None:
            request.transport.abort()  # the send is recorded; the client never hears of it
        return web.Response(body=body, content_type="application/json")

    async def _handle_templates(self, request: web.Request) -> web.Response:
        """A business account's templates, paged (`templates`); any valid token may read."""
        token = _bearer_token(request)
        open_to_all = not self._numbers and not self._tokens
        if not token or not (open_to_all or token in self._tokens or token in self._number_tokens):
            return GraphError(190).response()
        if not VERSION_RE.fullmatch(request.match_info["version"]):
            return GraphError(2500, message=f"Unknown path components: {request.path}").response()
        query = request.query
        page = templates_page(
            url=str(request.url.with_query(None)),
            limit=query.get("limit", ""),
            after=query.get("after", ""),
            fields=query.get("fields", ""),
        )
        if page is None:
            return GraphError(100, "Invalid cursor").response()
        return _json_response(page)

    async def _handle_unknown(self, request: web.Request) -> web.Response:
        if request.method != "POST" and request.path.rstrip("/").endswith("/messages"):
            return GraphError(100, message=f"Unsupported {request.method.lower()} request.").response()
        return GraphError(2500, message=f"Unknown path components: {request.path}").response()

    async def _handle_rules(self, request: web.Request) -> web.Response:
        if request.method == "GET":
            return _json_response({"rules": self._rule_list()})
        if request.method == "DELETE":
            self._rules.clear()
            return _json_response({"rules": []})
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST", "DELETE"])
        try:
            rule = Rule.parse(await self._read_json(request))
        except ValueError as exc:
            return _json_response({"error": str(exc)}, status=400)
        return _json_response({"rule": self._add_rule(rule)})

    async def _handle_config(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            try:
                self._update_config(await self._read_json(request))
            except ValueError as exc:
                return _json_response({"error": str(exc)}, status=400)
        elif request.method != "GET":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        return _json_response(self.config.public())

    async def _handle_messages(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            conversations = self._state.conversations
            self._state = _State(conversations=conversations)
            return _json_response({"count": 0, "messages": []})
        if request.method != "GET":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "DELETE"])
        records = self._message_list(request.query.get("to"))
        return _json_response({"count": len(records), "messages": records})

    async def _handle_stats(self, request: web.Request) -> web.Response:
        return _json_response(self._stats())


def _raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one: 1,000+ concurrent connections need the fds."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
