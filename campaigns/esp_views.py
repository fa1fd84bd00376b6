"""The ESP tracking webhook intake: authenticate → read strict JSON → the provider's shape → verify its
signature → accept the raw events into the inbox (crm.inbox, kind "esp"), answered 202; a worker applies
them (campaigns.inbox → campaigns.esp_tracking). Every refusal is a 4xx with a JSON error, never a 5xx;
with PostgreSQL down the answer is a 503 with Retry-After (crm.intake), so the ESP retries.

`/anymail/<provider>/tracking/<organization id>/` names the organization, so the provider account's
signing key (kept encrypted in its EmailSettings) is known before the signature is checked, and the
events touch only that organization's messages. Its basic auth is the organization's credential
(`tracking.organization_credentials`) or the deployment's ANYMAIL_WEBHOOK_SECRET. The URLs without
an organization (basic auth with ANYMAIL_WEBHOOK_SECRET) remain for the providers that sign nothing
(Postmark, SendGrid, Brevo), as configured before the organization's URL existed.
"""

from __future__ import annotations

import base64
import binascii
import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from campaigns import inbox as campaign_inbox
from crm import inbox_intake, intake
from crm.crypto import DecryptionError
from integrations.email import tracking
from integrations.models import EmailSettings

logger = logging.getLogger(__name__)


def _refused(status: int, error: str, **headers: str) -> JsonResponse:
    response = JsonResponse({"ok": False, "error": error[:300]}, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


def _basic_auth(request: HttpRequest) -> str:
    """The request's basic-auth `user:password`, or ""."""
    kind, _, encoded = request.headers.get("Authorization", "").partition(" ")
    if kind.lower() != "basic" or not encoded:
        return ""
    try:
        return base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return ""


def _authenticated(request: HttpRequest, organization_id: int | None) -> bool:
    secret = str(getattr(settings, "ANYMAIL", {}).get("WEBHOOK_SECRET") or "")
    allowed = [secret] if ":" in secret else []
    if organization_id is not None:
        allowed.append(tracking.organization_credentials(secret, organization_id))
    given = _basic_auth(request)
    # Every comparison is made (constant time each), whichever matches.
    matches = [constant_time_compare(given, a) for a in allowed if a]
    return bool(given) and any(matches)


def _signature_refusal(
    provider: str, request: HttpRequest, raw: bytes, payload: object, email: EmailSettings | None
) -> JsonResponse | None:
    """None when the provider's own signature (if it signs) checks out with the account's key."""
    if provider not in tracking.SIGNED:
        return None
    key = email.get_esp_webhook_key() if email is not None else ""
    if not key:
        if tracking.SIGNED[provider]:
            return _refused(403, f"no {tracking.esp_name(provider)} webhook signing key is configured")
        return None
    if provider == "mailgun":
        ok = isinstance(payload, dict) and tracking.mailgun_signature_ok(payload, key)
    else:
        ok = tracking.sendgrid_signature_ok(
            raw,
            signature=request.headers.get("X-Twilio-Email-Event-Webhook-Signature", ""),
            timestamp=request.headers.get("X-Twilio-Email-Event-Webhook-Timestamp", ""),
            verification_key=key,
        )
    return None if ok else _refused(403, "bad signature")


@csrf_exempt
@never_cache
@require_http_methods(["POST", "HEAD"])
@intake.durable
def esp_tracking_webhook(
    request: HttpRequest, provider: str, organization_id: int | str | None = None
) -> HttpResponse:
    """POST: 200 with how many events were accepted into the inbox; 401 without the basic auth; 403
    for a bad or impossible signature; 404 for an organization without email settings of that
    provider; 400/413 when malformed; 503 when they cannot be stored. HEAD: 200 (some providers
    probe the URL when it is configured)."""
    if provider not in tracking.VIEWS:
        return _refused(404, f"no tracking webhook for {provider!r}")
    organization_id = int(organization_id) if organization_id is not None else None  # the URL's digits
    if request.method == "HEAD":
        return HttpResponse()
    try:
        raw = intake.read_body(request)
    except intake.BadBody as exc:
        return exc.response()
    if not _authenticated(request, organization_id):
        logger.warning("%s tracking webhook: missing or wrong basic auth", provider)
        return _refused(401, "missing or wrong basic auth", **{"WWW-Authenticate": 'Basic realm="anymail"'})
    email: EmailSettings | None = None
    if organization_id is not None:  # looked up only for an authenticated sender: no probing
        email = EmailSettings.objects.filter(organization_id=organization_id, provider=provider).first()
        if email is None:
            return _refused(404, f"organization {organization_id} does not send through {provider}")
    try:
        payload = intake.parse_json(raw)
        raws = tracking.raw_events(provider, payload)
    except intake.BadBody as exc:
        return exc.response()
    except tracking.Malformed as exc:
        return _refused(400, str(exc))
    try:
        refusal = _signature_refusal(provider, request, raw, payload, email)
    except DecryptionError:
        # Our configuration, not the sender's mistake: a 503 makes the provider retry once it is fixed.
        logger.error(
            "%s tracking webhook: the signing key of organization %s cannot be read",
            provider,
            organization_id,
        )
        return _refused(503, "the signing key cannot be read", **{"Retry-After": "300"})
    if refusal is not None:
        logger.warning(
            "%s tracking webhook for organization %s: %s", provider, organization_id, refusal.content
        )
        return refusal
    try:
        tracking.events(provider, raws)  # anymail can read every one of them: refused now, not later
    except tracking.Malformed as exc:
        return _refused(400, str(exc))
    inbox_intake.accept(
        kind=campaign_inbox.ESP,
        payload=campaign_inbox.esp_payload(provider, raws),
        organization_id=organization_id,
    )
    # 200, not 202: Postmark and Mailgun take only a 200 as delivered and retry anything else.
    return JsonResponse({"ok": True, "accepted": len(raws)})
