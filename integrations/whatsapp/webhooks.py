"""Meta WhatsApp webhooks: the signature check and the payload as plain events (no domain models).

Meta POSTs ``{"object": "whatsapp_business_account", "entry": [{"changes": [{"field", "value"}]}]}``;
``value.statuses`` carries message status callbacks, ``value.user_preferences`` marketing
stop/resume choices and ``value.messages`` what customers send (every type; one the API does not
support comes as ``unsupported``). Other fields are counted as ignored, never an error.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

SIGNATURE_RE = re.compile(r"sha256=([0-9a-fA-F]{64})")
DIGITS_RE = re.compile(r"[0-9]{1,20}")
# Unix seconds; 11 digits reach the year 5138, far past anything Meta sends.
TIMESTAMP_RE = re.compile(r"[0-9]{1,11}")

STATUSES = frozenset({"sent", "delivered", "read", "failed"})
# Documented Meta statuses a campaign does not track: skipped rather than refused, because a 400
# makes Meta retry the whole batch (the statuses we do track in it included) for days.
UNTRACKED_STATUSES = frozenset({"deleted", "warning", "played"})
MARKETING_CATEGORY = "marketing_messages"

PreferenceValue = Literal["stop", "resume"]


@dataclass(frozen=True)
class StatusEvent:
    wamid: str
    status: str  # one of STATUSES
    timestamp: datetime  # aware, UTC
    recipient_id: str = ""
    biz_opaque_callback_data: str = ""
    error_code: int | None = None
    error_title: str = ""
    pricing_category: str = ""
    billable: bool | None = None


@dataclass(frozen=True)
class PreferenceEvent:
    wa_id: str
    value: PreferenceValue
    timestamp: datetime  # aware, UTC
    # The business number that received it (value.metadata.phone_number_id): the consent decision
    # belongs to the relationship with that number's organization only.
    phone_number_id: str = ""


# The message types Meta documents; another one is kept as "unsupported" (never refused).
MESSAGE_TYPES = frozenset(
    {
        "text",
        "button",
        "interactive",
        "image",
        "audio",
        "video",
        "document",
        "sticker",
        "location",
        "contacts",
        "reaction",
        "unsupported",
        "order",
        "system",
    }
)
MEDIA_TYPES = frozenset({"image", "audio", "video", "document", "sticker"})


@dataclass(frozen=True)
class InboundMessage:
    """One message a customer sent to a business number, as plain values."""

    wamid: str
    wa_id: str  # the sender, digits
    timestamp: datetime  # aware, UTC
    kind: str  # one of MESSAGE_TYPES
    phone_number_id: str = ""  # the business number that received it
    text: str = ""  # the text, caption, button or list title, location, contact names or emoji
    payload: str = ""  # a quick-reply button's payload, an interactive reply's id
    media_id: str = ""  # Meta's media id (downloaded on demand only)
    media_mime: str = ""
    media_filename: str = ""
    context_wamid: str = ""  # the message it answers (or reacts to)
    profile_name: str = ""


@dataclass(frozen=True)
class WebhookBatch:
    statuses: list[StatusEvent] = field(default_factory=list)
    preferences: list[PreferenceEvent] = field(default_factory=list)
    messages: list[InboundMessage] = field(default_factory=list)
    ignored: int = 0  # untracked statuses, other fields and categories


def verify_signature(raw_body: bytes, header: str | None, app_secret: str) -> bool:
    """True only when ``header`` is ``sha256=<hex>`` of the HMAC-SHA256 of the raw body with the secret."""
    if not app_secret or not header:
        return False
    match = SIGNATURE_RE.fullmatch(header.strip())
    if match is None:
        return False
    expected = hmac.new(app_secret.encode(), raw_body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), match.group(1).lower().encode())


def _timestamp(raw: Any, where: str) -> datetime:
    # bool is an int subclass: `true` must not pass for 1970-01-01T00:00:01.
    if isinstance(raw, bool) or not isinstance(raw, int | str) or not TIMESTAMP_RE.fullmatch(str(raw)):
        raise ValueError(f"{where}: timestamp must be Unix seconds, got {raw!r}")
    return datetime.fromtimestamp(int(raw), tz=UTC)


def _text(raw: Any) -> str:
    """A string field Meta may send as a number; anything else counts as absent."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)
    return ""


def _list(container: dict[str, Any], key: str, where: str) -> list[Any]:
    value = container.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{where}.{key} must be a list, got {type(value).__name__}")
    return value


def _error(status: dict[str, Any]) -> tuple[int | None, str]:
    # Optional detail: a malformed error is dropped rather than refusing the batch.
    errors = status.get("errors")
    if not isinstance(errors, list) or not errors or not isinstance(errors[0], dict):
        return None, ""
    first = errors[0]
    code_text = _text(first.get("code"))
    code = int(code_text) if DIGITS_RE.fullmatch(code_text) else None
    title = _text(first.get("title")) or _text(first.get("message"))
    return code, title


def _status(raw: Any, where: str) -> StatusEvent | None:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object")
    wamid, status = _text(raw.get("id")), _text(raw.get("status"))
    if not wamid:
        raise ValueError(f"{where} has no id")
    if not status:
        raise ValueError(f"{where} has no status")
    if status in UNTRACKED_STATUSES:
        return None
    if status not in STATUSES:
        raise ValueError(f"{where}: unknown status {status!r}")
    code, title = _error(raw)
    pricing = raw.get("pricing")
    pricing = pricing if isinstance(pricing, dict) else {}
    billable = pricing.get("billable")
    return StatusEvent(
        wamid=wamid,
        status=status,
        timestamp=_timestamp(raw.get("timestamp"), where),
        recipient_id=_text(raw.get("recipient_id")),
        biz_opaque_callback_data=_text(raw.get("biz_opaque_callback_data")),
        error_code=code,
        error_title=title,
        pricing_category=_text(pricing.get("category")),
        billable=billable if isinstance(billable, bool) else None,
    )


def _preference(raw: Any, where: str, phone_number_id: str) -> PreferenceEvent | None:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object")
    if raw.get("category") != MARKETING_CATEGORY:
        return None
    wa_id = _text(raw.get("wa_id"))
    if not DIGITS_RE.fullmatch(wa_id):
        raise ValueError(f"{where}: wa_id must be digits, got {raw.get('wa_id')!r}")
    value = raw.get("value")
    if value in ("stop", "resume"):
        return PreferenceEvent(
            wa_id=wa_id,
            value=value,
            timestamp=_timestamp(raw.get("timestamp"), where),
            phone_number_id=phone_number_id,
        )
    raise ValueError(f"{where}: unknown preference value {value!r}")


def parse(payload: Any) -> WebhookBatch:
    """The status, marketing-preference and inbound message events of one webhook POST; ValueError
    says what is malformed."""
    statuses: list[StatusEvent] = []
    preferences: list[PreferenceEvent] = []
    messages: list[InboundMessage] = []
    ignored = 0
    for where, value in _change_values(payload):
        ignored += _collect(value, where, statuses, preferences)
        messages += _messages(value, where)
    return WebhookBatch(statuses=statuses, preferences=preferences, messages=messages, ignored=ignored)


def _dict(raw: Any) -> dict[str, Any]:
    return raw if isinstance(raw, dict) else {}


def _profiles(value: dict[str, Any]) -> dict[str, str]:
    """wa_id -> the profile name Meta gives beside the messages (optional detail)."""
    names: dict[str, str] = {}
    contacts = value.get("contacts")
    for contact in contacts if isinstance(contacts, list) else []:
        contact = _dict(contact)
        names[_text(contact.get("wa_id"))] = _text(_dict(contact.get("profile")).get("name"))[:200]
    return names


def _interactive(body: dict[str, Any]) -> tuple[str, str]:
    """(title, id) of an interactive reply (button_reply, list_reply, nfm_reply)."""
    reply = _dict(body.get(_text(body.get("type"))))
    return _text(reply.get("title")) or _text(reply.get("description")), _text(reply.get("id"))


def _contact_names(raw: Any) -> str:
    cards = raw if isinstance(raw, list) else []
    return ", ".join(
        _text(_dict(_dict(card).get("name")).get("formatted_name"))
        for card in cards
        if isinstance(card, dict)
    )


def _content(kind: str, raw: dict[str, Any]) -> dict[str, str]:
    """The text, payload, media and context of one message by its type; absent details are empty."""
    body = _dict(raw.get(kind))
    if kind == "text":
        return {"text": _text(body.get("body"))}
    if kind == "button":
        return {"text": _text(body.get("text")), "payload": _text(body.get("payload"))}
    if kind == "interactive":
        title, reply_id = _interactive(body)
        return {"text": title, "payload": reply_id}
    if kind in MEDIA_TYPES:
        return {
            "text": _text(body.get("caption")),
            "media_id": _text(body.get("id")),
            "media_mime": _text(body.get("mime_type")),
            "media_filename": _text(body.get("filename")),
        }
    if kind == "location":
        place = " — ".join(x for x in (_text(body.get("name")), _text(body.get("address"))) if x)
        where = f"{body.get('latitude')},{body.get('longitude')}"
        return {"text": f"{place} ({where})" if place else where}
    if kind == "contacts":
        return {"text": _contact_names(raw.get("contacts"))}
    if kind == "reaction":
        return {"text": _text(body.get("emoji")), "context_wamid": _text(body.get("message_id"))}
    return {"text": _text(_dict(body).get("body"))}


def _message(raw: Any, where: str, phone_number_id: str, names: dict[str, str]) -> InboundMessage:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object")
    wamid, wa_id = _text(raw.get("id")), _text(raw.get("from"))
    if not wamid or len(wamid) > 128:
        raise ValueError(f"{where} has no id (or one over 128 characters)")
    if not DIGITS_RE.fullmatch(wa_id):
        raise ValueError(f"{where}: from must be digits, got {raw.get('from')!r}")
    kind = _text(raw.get("type"))
    kind = kind if kind in MESSAGE_TYPES else "unsupported"
    content = _content(kind, raw)
    context = _text(_dict(raw.get("context")).get("id"))
    return InboundMessage(
        wamid=wamid,
        wa_id=wa_id,
        timestamp=_timestamp(raw.get("timestamp"), where),
        kind=kind,
        phone_number_id=phone_number_id,
        text=content.get("text", "")[:4096],
        payload=content.get("payload", "")[:256],
        media_id=content.get("media_id", "")[:128],
        media_mime=content.get("media_mime", "")[:100],
        media_filename=content.get("media_filename", "")[:255],
        context_wamid=(content.get("context_wamid") or context)[:128],
        profile_name=names.get(wa_id, ""),
    )


def _messages(value: dict[str, Any], where: str) -> list[InboundMessage]:
    metadata = value.get("metadata")
    receiver = _text(metadata.get("phone_number_id")) if isinstance(metadata, dict) else ""
    raws = _list(value, "messages", f"{where}.value")
    names = _profiles(value) if raws else {}
    return [_message(raw, f"{where}.value.messages[{k}]", receiver, names) for k, raw in enumerate(raws)]


def phone_number_id(payload: Any) -> str:
    """The business number a parsed (checked) webhook body is for: its first change's
    value.metadata.phone_number_id, "" when it names none. Meta sends one account's changes per
    body; the intake stores the body under that number's organization."""
    for _, value in _change_values(payload):
        metadata = value.get("metadata")
        number = _text(metadata.get("phone_number_id")) if isinstance(metadata, dict) else ""
        if number:
            return number
    return ""


def _change_values(payload: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, value) of each change of each entry, in order, each checked as it comes."""
    if not isinstance(payload, dict):
        raise ValueError("the payload must be a JSON object")
    if payload.get("object") != "whatsapp_business_account":
        raise ValueError(f"unexpected object {payload.get('object')!r}")
    if not isinstance(payload.get("entry"), list):
        raise ValueError("entry must be a list")
    for i, entry in enumerate(payload["entry"]):
        if not isinstance(entry, dict):
            raise ValueError(f"entry[{i}] must be an object")
        for j, change in enumerate(_list(entry, "changes", f"entry[{i}]")):
            where = f"entry[{i}].changes[{j}]"
            if not isinstance(change, dict):
                raise ValueError(f"{where} must be an object")
            value = change.get("value")
            if not isinstance(value, dict):
                raise ValueError(f"{where}.value must be an object")
            yield where, value


def _collect(
    value: dict[str, Any], where: str, statuses: list[StatusEvent], preferences: list[PreferenceEvent]
) -> int:
    """Add one change's statuses and preferences to the lists; returns how many of its events are
    ignored (untracked statuses and categories, another field)."""
    ignored = 0
    for k, raw in enumerate(_list(value, "statuses", f"{where}.value")):
        status = _status(raw, f"{where}.value.statuses[{k}]")
        if status is None:
            ignored += 1
        else:
            statuses.append(status)
    metadata = value.get("metadata")
    receiver = _text(metadata.get("phone_number_id")) if isinstance(metadata, dict) else ""
    for k, raw in enumerate(_list(value, "user_preferences", f"{where}.value")):
        preference = _preference(raw, f"{where}.value.user_preferences[{k}]", receiver)
        if preference is None:
            ignored += 1
        else:
            preferences.append(preference)
    if not any(key in value for key in ("messages", "statuses", "user_preferences")):
        ignored += 1  # another field (template status, account update...)
    return ignored
