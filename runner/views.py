"""The webhook intake: authenticate, store the event as an item, answer 202 at once."""

from __future__ import annotations

import hashlib
import hmac

from django.http import HttpRequest, JsonResponse
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from crm import intake
from crm.models import Organization
from runner import cache, events
from runner.models import Handler

SIGNATURE_HEADER = "X-Runner-Signature"


def signature(secret: str, body: bytes) -> str:
    """The value of X-Runner-Signature for a body: `sha256=<hex HMAC-SHA256>`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _authenticated(request: HttpRequest, handler: Handler, secret: str) -> bool:
    if handler.webhook_auth == Handler.WebhookAuth.TOKEN:
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {secret}".encode())
    given = request.headers.get(SIGNATURE_HEADER, "")
    return hmac.compare_digest(given.encode(), signature(secret, request.body).encode())


@csrf_exempt
@require_POST
@intake.durable
def hook(request: HttpRequest, integration_key: str, handler_key: str) -> JsonResponse:
    handler, secret = cache.webhook_handler(integration_key, handler_key)
    if handler is None or not handler.integration.enabled:
        return JsonResponse({"error": _("Unknown integration handler.")}, status=404)
    try:
        raw = intake.read_body(request)
    except intake.BadBody as exc:
        return exc.response()
    if not secret or not _authenticated(request, handler, secret):
        return JsonResponse({"error": _("Invalid signature or token.")}, status=401)
    organization_id = handler.organization_id
    if organization_id is None:
        slug = request.GET.get("org", "")
        organization_id = (
            Organization.objects.filter(slug=slug).values_list("id", flat=True).first() if slug else None
        )
        if organization_id is None:
            return JsonResponse({"error": _("Name the organization: ?org=<slug>.")}, status=400)
    try:
        payload = intake.parse_json(raw)
        if not isinstance(payload, dict | list):
            raise intake.BadBody(f"the body must be a JSON object or array, not {type(payload).__name__}")
    except intake.BadBody as exc:
        return exc.response()
    # Only the sender's event id recognises a retry: a body's `id` usually names the record (an
    # order updated twice is two events), so it labels the item and de-duplicates nothing.
    event_id = request.headers.get("X-Event-Id", "")
    external_id = event_id or (payload.get("id") if isinstance(payload, dict) else "")
    execution_id, duplicate = events.webhook_receive(
        handler=handler,
        organization_id=organization_id,
        event_id=event_id,
        external_id=str(external_id or ""),
        payload=payload,
    )
    if duplicate:  # a retry of an event already stored: nothing stored again
        return JsonResponse({"execution_id": execution_id, "status": "duplicate"}, status=200)
    return JsonResponse({"execution_id": execution_id, "status": "accepted"}, status=202)
