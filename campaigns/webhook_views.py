"""Meta's WhatsApp webhook endpoint: the subscription handshake and signed status callbacks."""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from campaigns import inbox as webhook_inbox
from crm import inbox_intake, intake
from integrations.models import WhatsappNumber
from integrations.whatsapp import webhooks

logger = logging.getLogger(__name__)

# The inbox's INSERT with the organization of the number the body is for, looked up in the same
# statement (a unique index probe): the drain serves organizations in turn (crm/inbox.py). An
# unknown number leaves it NULL, served as one more tenant.
ACCEPT = inbox_intake.Statement(
    f"INSERT INTO {inbox_intake.TABLE} (kind, organization_id, payload, error) "  # noqa: S608 - table names only
    f"SELECT r.kind, n.organization_id, r.payload, '' FROM requests r "
    f"LEFT JOIN {WhatsappNumber._meta.db_table} n ON n.phone_number_id = r.phone_number_id ORDER BY r.n",
    (("kind", "text"), ("phone_number_id", "text"), ("payload", "text")),
)


def _handshake(request: HttpRequest) -> HttpResponse:
    """Meta's subscription check: echo hub.challenge only to the holder of the verify token."""
    expected = settings.WHATSAPP_VERIFY_TOKEN
    given = request.GET.get("hub.verify_token", "")
    if (
        expected
        and request.GET.get("hub.mode") == "subscribe"
        and hmac.compare_digest(given.encode(), expected.encode())
    ):
        return HttpResponse(request.GET.get("hub.challenge", ""), content_type="text/plain")
    logger.warning("whatsapp webhook: verification refused (mode %r)", request.GET.get("hub.mode"))
    return JsonResponse({"ok": False, "error": "verification refused"}, status=403)


def _bad_request(reason: str) -> JsonResponse:
    # A 400, not a 500: Meta would retry the same payload for days and it would never parse.
    logger.warning("whatsapp webhook: refused payload: %s", reason)
    return JsonResponse({"ok": False, "error": reason}, status=400)


@csrf_exempt
@never_cache
@require_http_methods(["GET", "POST"])
@intake.durable
def whatsapp_webhook(request: HttpRequest) -> HttpResponse:
    """GET: the verification handshake. POST: 403 unless signed with the app secret, 400 when
    malformed, 503 when it cannot be stored, else 200 once stored in the inbox (applied by a worker
    moments later): `accepted` statuses, preferences and inbound messages, `skipped` the rest."""
    if request.method == "GET":
        return _handshake(request)
    try:
        raw = intake.read_body(request)
    except intake.BadBody as exc:
        return exc.response()
    if not webhooks.verify_signature(
        raw, request.headers.get("X-Hub-Signature-256"), settings.WHATSAPP_APP_SECRET
    ):
        logger.warning("whatsapp webhook: bad or missing signature (%s bytes)", len(raw))
        return JsonResponse({"ok": False, "error": "bad or missing X-Hub-Signature-256"}, status=403)
    try:
        payload = intake.json_object(raw)
        batch = webhooks.parse(payload)
    except ValueError as exc:
        return _bad_request(str(exc)[:300])
    accepted = len(batch.statuses) + len(batch.preferences) + len(batch.messages)
    if accepted:
        # The body as received (checked strict UTF-8 JSON): the worker parses it again.
        inbox_intake.write(ACCEPT, [webhook_inbox.KIND, webhooks.phone_number_id(payload), raw.decode()])
        inbox_intake.notify(webhook_inbox.KIND)
    return JsonResponse({"ok": True, "accepted": accepted, "skipped": batch.ignored})
