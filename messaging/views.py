"""The messaging layer's intake: Chatwoot's webhook of an organization (its signed URL)."""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from crm import inbox_intake, intake
from integrations.chatwoot.webhooks import agent_reply
from messaging import chatwoot_replies

logger = logging.getLogger(__name__)


@csrf_exempt
@never_cache
@require_http_methods(["POST"])
@intake.durable
def chatwoot_webhook(request: HttpRequest, token: str) -> HttpResponse:
    """403 unless the URL's token is the organization's, 400 when malformed, 503 when it cannot be
    stored, else 200: `accepted` 1 for an agent's reply (sent by a worker moments later), else 0."""
    organization_id = chatwoot_replies.organization_of(token)
    if organization_id is None:
        logger.warning("chatwoot webhook: unknown token")
        return JsonResponse({"ok": False, "error": "unknown webhook token"}, status=403)
    try:
        raw = intake.read_body(request)
        reply = agent_reply(intake.json_object(raw))
    except intake.BadBody as exc:
        return exc.response()
    except ValueError as exc:
        return JsonResponse({"ok": False, "error": str(exc)[:300]}, status=400)
    if reply is not None:
        inbox_intake.accept(kind=chatwoot_replies.KIND, payload=raw.decode(), organization_id=organization_id)
    return JsonResponse({"ok": True, "accepted": int(reply is not None)})
