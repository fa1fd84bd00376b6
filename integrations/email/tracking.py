"""ESP tracking webhooks as plain values: which providers, how each authenticates, and a strict parse
of a body (already strict JSON, crm.intake) into django-anymail's normalized tracking events.

Supported: the providers an organization can send through (``EmailSettings.Provider``). Each is
authenticated by HTTP basic auth (``ANYMAIL_WEBHOOK_SECRET``), and where the provider signs its
webhooks with a key of the provider *account* (so of one organization), by that signature too:

- Postmark, Brevo: basic auth only (they sign nothing).
- Mailgun: basic auth and its HMAC-SHA256 signature block, keyed by the account's HTTP webhook
  signing key; without a key nothing is accepted.
- SendGrid: basic auth, and its Signed Event Webhook (ECDSA over timestamp + body) when the
  account's verification key is set.

django-anymail does the per-provider normalization (its tracking views' ``esp_to_anymail_event``);
this module decides first that the body has the provider's shape and turns anything anymail cannot
read into ``Malformed`` (a 400), never an exception that would be a 500.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from typing import Any

from anymail.exceptions import AnymailError
from anymail.signals import AnymailTrackingEvent
from anymail.webhooks.base import AnymailCoreWebhookView
from anymail.webhooks.brevo import BrevoTrackingWebhookView
from anymail.webhooks.mailgun import MailgunTrackingWebhookView
from anymail.webhooks.postmark import PostmarkTrackingWebhookView
from anymail.webhooks.sendgrid import SendGridTrackingWebhookView
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

# provider (as EmailSettings.provider and the URL say it) -> anymail's tracking view
VIEWS: dict[str, type[AnymailCoreWebhookView]] = {
    "postmark": PostmarkTrackingWebhookView,
    "sendgrid": SendGridTrackingWebhookView,
    "mailgun": MailgunTrackingWebhookView,
    "brevo": BrevoTrackingWebhookView,
}
PROVIDERS = tuple(VIEWS)
# Providers whose webhooks are signed with a key of the provider account (kept per organization).
SIGNED = {"mailgun": True, "sendgrid": False}  # True: the key is required to accept anything
MAX_EVENTS = 1000  # SendGrid batches events; more than this in one POST is not SendGrid
# Fields of a normalized event the application reads as text.
_TEXT_FIELDS = ("message_id", "event_id", "recipient", "description", "mta_response", "reject_reason")


class Malformed(ValueError):
    """A body that authenticates but is not the provider's tracking webhook (a 400)."""


def esp_name(provider: str) -> str:
    """The provider's own spelling (anymail's), for logs and messages."""
    return str(VIEWS[provider].esp_name)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Malformed(f"{where} must be a JSON object, not {type(value).__name__}")
    return value


def _text(container: dict[str, Any], key: str, where: str) -> str:
    value = container.get(key)
    if not isinstance(value, str) or not value:
        raise Malformed(f"{where}.{key} must be a non-empty string")
    return value


def raw_events(provider: str, payload: Any) -> list[dict[str, Any]]:
    """The provider's raw events in one webhook body, checked for its outer shape; raises Malformed."""
    if provider == "sendgrid":
        if not isinstance(payload, list):
            raise Malformed(f"a SendGrid webhook is a JSON array of events, not {type(payload).__name__}")
        if len(payload) > MAX_EVENTS:
            raise Malformed(f"more than {MAX_EVENTS} events in one webhook")
        events = [_object(item, f"event[{i}]") for i, item in enumerate(payload)]
        for i, event in enumerate(events):
            _text(event, "event", f"event[{i}]")
        return events
    body = _object(payload, "the body")
    if provider == "postmark":
        _text(body, "RecordType", "the body")
    elif provider == "mailgun":
        signature = _object(body.get("signature"), "the body.signature")
        for key in ("token", "signature"):
            _text(signature, key, "the body.signature")
        if not isinstance(signature.get("timestamp"), str | int) or isinstance(signature["timestamp"], bool):
            raise Malformed("the body.signature.timestamp must be a string or an integer")
        _text(_object(body.get("event-data"), "the body.event-data"), "event", "the body.event-data")
    elif provider == "brevo":
        _text(body, "event", "the body")
        if "items" in body:
            raise Malformed("a Brevo inbound webhook posted to the tracking URL")
    else:
        raise Malformed(f"unsupported provider {provider!r}")
    return [body]


def _as_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def events(provider: str, raws: list[dict[str, Any]]) -> list[AnymailTrackingEvent]:
    """anymail's normalized events for raw events of `raw_events`; raises Malformed for any anymail
    cannot read. Text fields are text (or None) whatever type the body gave them."""
    # Only the conversion is used, which reads class attributes: no instance set-up (the views'
    # __init__ reads global webhook settings this deployment keeps per organization).
    view: Any = object.__new__(VIEWS[provider])
    normalized: list[AnymailTrackingEvent] = []
    for i, raw in enumerate(raws):
        try:
            event = view.esp_to_anymail_event(raw)
        except (
            AnymailError,
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            IndexError,
            OverflowError,
        ) as exc:
            raise Malformed(f"event[{i}] is not a {esp_name(provider)} event: {type(exc).__name__}") from None
        except OSError as exc:  # datetime.fromtimestamp of a timestamp out of the platform's range
            raise Malformed(f"event[{i}]: {exc}"[:200]) from None
        for field in _TEXT_FIELDS:
            setattr(event, field, _as_text(getattr(event, field, None)))
        normalized.append(event)
    return normalized


def parse(provider: str, payload: Any) -> list[AnymailTrackingEvent]:
    """The normalized tracking events of one webhook body (strict JSON); raises Malformed."""
    return events(provider, raw_events(provider, payload))


def mailgun_signature_ok(payload: dict[str, Any], signing_key: str) -> bool:
    """Mailgun's signature block: HMAC-SHA256 of timestamp + token under the account's signing key."""
    signature = payload.get("signature")
    if not signing_key or not isinstance(signature, dict):
        return False
    timestamp, token, given = (signature.get(k) for k in ("timestamp", "token", "signature"))
    if not isinstance(token, str) or not isinstance(given, str) or not isinstance(timestamp, str | int):
        return False
    expected = hmac.new(signing_key.encode(), f"{timestamp}{token}".encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), given.encode(errors="replace"))


def sendgrid_signature_ok(raw_body: bytes, *, signature: str, timestamp: str, verification_key: str) -> bool:
    """SendGrid's Signed Event Webhook: ECDSA (SHA-256) over timestamp + raw body, checked with the
    account's verification key (base64 of the public key, as SendGrid shows it)."""
    if not (signature and timestamp and verification_key):
        return False
    try:
        key = serialization.load_pem_public_key(
            f"-----BEGIN PUBLIC KEY-----\n{verification_key.strip()}\n-----END PUBLIC KEY-----".encode()
        )
        if not isinstance(key, ec.EllipticCurvePublicKey):
            return False
        key.verify(base64.b64decode(signature), timestamp.encode() + raw_body, ec.ECDSA(hashes.SHA256()))
    except (ValueError, TypeError, binascii.Error, InvalidSignature, UnicodeEncodeError):
        return False
    return True


def sendgrid_key_valid(verification_key: str) -> bool:
    """True when the text is a public key SendGrid's signatures can be checked with."""
    try:
        key = serialization.load_pem_public_key(
            f"-----BEGIN PUBLIC KEY-----\n{verification_key.strip()}\n-----END PUBLIC KEY-----".encode()
        )
    except (ValueError, TypeError, UnicodeEncodeError):
        return False
    return isinstance(key, ec.EllipticCurvePublicKey)


def organization_credentials(webhook_secret: str, organization_id: int) -> str:
    """The basic-auth `user:password` of one organization's tracking URLs, derived from the
    deployment's ANYMAIL_WEBHOOK_SECRET: shown to that organization's operators (to paste into its
    ESP account) without showing them the deployment's secret or another organization's.
    "" when the deployment has no secret (then nothing is accepted)."""
    user, sep, password = webhook_secret.partition(":")
    if not sep or not user or not password:
        return ""
    digest = hmac.new(password.encode(), f"anymail-organization:{organization_id}".encode(), hashlib.sha256)
    return f"{user}:{base64.urlsafe_b64encode(digest.digest()[:24]).decode()}"
