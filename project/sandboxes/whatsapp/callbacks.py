"""The sandbox server: an aiohttp app on its own event loop in a daemon thread (see the package)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from project.sandboxes.whatsapp.base import SandboxBase, _bearer_token
from project.sandboxes.whatsapp.graph_errors import ERROR_DOCS, ERRORS, GraphError, _dumps, _json_response
from project.sandboxes.whatsapp.rules import STATUS_SEQUENCE
from project.sandboxes.whatsapp.validation import TO_RE

logger = logging.getLogger(__name__)

# A 1x1 PNG: what every simulated media id downloads as.
SANDBOX_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


class StatusWebhooks(SandboxBase):
    """What the sandbox posts to the webhook (status callbacks, inbound messages) and the media it serves."""

    # -- status webhooks ------------------------------------------------------------------------

    def _status_payload(
        self, record: dict[str, Any], status: str, failure_code: int | None
    ) -> dict[str, Any]:
        """One Meta status callback document for ``record``."""
        entry: dict[str, Any] = {
            "id": record["wamid"],
            "status": status,
            "timestamp": str(int(time.time())),
            "recipient_id": record["wa_id"],
        }
        if record["biz_opaque_callback_data"] is not None:
            entry["biz_opaque_callback_data"] = record["biz_opaque_callback_data"]
        if status == "failed":
            code = failure_code or 131000
            title, details = ERRORS.get(code, ERRORS[131000])
            entry["errors"] = [
                {
                    "code": code,
                    "title": title,
                    "message": title,
                    "error_data": {"details": details},
                    "href": ERROR_DOCS,
                }
            ]
        elif status in ("sent", "delivered"):
            # Meta sends conversation and pricing with sent and delivered, not with read.
            conversation = self._state.conversations.setdefault(record["wa_id"], os.urandom(16).hex())
            entry["conversation"] = {"id": conversation, "origin": {"type": "marketing"}}
            if status == "sent":
                entry["conversation"]["expiration_timestamp"] = str(int(time.time()) + 86400)
            entry["pricing"] = {
                "billable": True,
                "pricing_model": "PMP",
                "category": "marketing",
                "type": "regular",
            }
        value = {
            "messaging_product": "whatsapp",
            "metadata": {
                "display_phone_number": self.config.display_phone_number,
                "phone_number_id": record["phone_number_id"],
            },
            "statuses": [entry],
        }
        return {
            "object": "whatsapp_business_account",
            "entry": [{"id": self.config.waba_id, "changes": [{"field": "messages", "value": value}]}],
        }

    async def _deliver_statuses(
        self, record: dict[str, Any], failure_code: int | None, url: str, secret: str
    ) -> None:
        """POST the status callbacks for one accepted send, one after another (so they arrive in order)."""
        started = asyncio.get_running_loop().time()
        statuses = ("failed",) if failure_code is not None else STATUS_SEQUENCE
        for index, status in enumerate(statuses[: len(self.config.status_delays_ms)]):

            def due(index: int = index) -> float:
                delays = self.config.status_delays_ms
                return started + (delays[min(index, len(delays) - 1)] / 1000 if delays else 0)

            await self._wait_until(due)
            body = _dumps(self._status_payload(record, status, failure_code))
            await self._post_webhook(url, secret, body)

    async def _post_webhook(self, url: str, secret: str, body: bytes) -> None:
        """POST one signed callback; failures are logged and counted, never raised."""
        session = self._session
        if session is None:
            return
        key = secret.encode()
        headers = {
            "Content-Type": "application/json",
            "X-Hub-Signature-256": "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest(),
            # Meta still sends the legacy SHA-1 signature alongside.
            "X-Hub-Signature": "sha1=" + hmac.new(key, body, hashlib.sha1).hexdigest(),
        }
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                ok = response.status < 300
                if not ok:
                    logger.warning("whatsapp sandbox: webhook %s answered HTTP %s", url, response.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("whatsapp sandbox: webhook %s failed: %r", url, exc)
            ok = False
        if ok:
            self._state.webhooks_delivered += 1
        else:
            self._state.webhooks_failed += 1

    async def _handle_inbound(self, request: web.Request) -> web.Response:
        """Simulate a customer's message: ``{"from": "5511...", "text": "PARAR", "phone_number_id":
        "...", "type": "text"|"button"|"image", "context_id": "wamid...", "name": "Ana"}`` is POSTed
        to the webhook as Meta would (signed); answers ``{"wamid", "delivered"}``."""
        try:
            data = await self._read_json(request)
            payload, wamid = self._inbound_payload(data)
        except ValueError as exc:
            return _json_response({"error": str(exc)}, status=400)
        config = self.config
        if not (config.webhook_url and config.app_secret):
            return _json_response({"error": "configure webhook_url and app_secret first"}, status=409)
        before = self._state.webhooks_delivered
        await self._post_webhook(config.webhook_url, config.app_secret, _dumps(payload))
        return _json_response({"wamid": wamid, "delivered": self._state.webhooks_delivered > before})

    async def _handle_media(self, request: web.Request) -> web.Response:
        """Meta's media lookup: the (short-lived) URL of a media id a simulated inbound carried."""
        if not _bearer_token(request):
            return GraphError(190).response()
        media_id = request.match_info["media_id"]
        if not media_id.startswith("media-"):
            return GraphError(
                100, message=f"Unsupported get request. Object with ID '{media_id}' does not exist"
            ).response()
        url = str(request.url.with_path(f"/_sandbox/media/{media_id}").with_query(None))
        return _json_response(
            {"url": url, "mime_type": "image/png", "id": media_id, "messaging_product": "whatsapp"}
        )

    async def _handle_media_bytes(self, request: web.Request) -> web.Response:
        if not _bearer_token(request):
            return GraphError(190).response()
        return web.Response(body=SANDBOX_PNG, content_type="image/png")

    def _inbound_payload(self, data: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        sender = str(data.get("from", "")).lstrip("+")
        if not TO_RE.fullmatch(sender):
            raise ValueError("from must be a phone number of 8 to 15 digits")
        phone_number_id = str(data.get("phone_number_id") or next(iter(self._numbers), "") or "1234567890")
        kind = str(data.get("type", "text"))
        text = str(data.get("text", ""))
        wamid = "wamid.IN" + self._new_wamid(sender).removeprefix("wamid.")
        message: dict[str, Any] = {
            "from": sender,
            "id": wamid,
            "timestamp": str(int(time.time())),
            "type": kind,
        }
        if kind == "text":
            message["text"] = {"body": text}
        elif kind == "button":
            message["button"] = {"text": text, "payload": str(data.get("payload", text))}
        elif kind in ("image", "audio", "video", "document", "sticker"):
            message[kind] = {
                "id": f"media-{wamid[-12:]}",
                "mime_type": str(data.get("mime_type", "image/jpeg")),
            }
            if text:
                message[kind]["caption"] = text
        else:
            raise ValueError("type must be text, button, image, audio, video, document or sticker")
        if data.get("context_id"):
            message["context"] = {"from": self.config.display_phone_number, "id": str(data["context_id"])}
        value = {
            "messaging_product": "whatsapp",
            "metadata": {
                "display_phone_number": self.config.display_phone_number,
                "phone_number_id": phone_number_id,
            },
            "contacts": [{"profile": {"name": str(data.get("name", ""))}, "wa_id": sender}],
            "messages": [message],
        }
        payload = {
            "object": "whatsapp_business_account",
            "entry": [{"id": self.config.waba_id, "changes": [{"field": "messages", "value": value}]}],
        }
        return payload, wamid
