"""Sending through an email service provider's API with django-anymail: plain values in, an EspResult out.

Each organization has its own ESP account, so the anymail backend is built for every call from the
credentials the caller passes (anymail backends take their settings as constructor kwargs) and never
from global settings. The stdlib message built for SMTP is converted, not rebuilt, so both paths send
the same subject, bodies and headers (List-Unsubscribe, List-Unsubscribe-Post, Message-ID).

What a failure means, as for SMTP (integrations.email.bounces):

- the ESP refused or found invalid the recipient -> a hard bounce (``Failure.HARD_BOUNCE``);
- 401/403, and any other answer of the API (a From address it does not know, a malformed request)
  -> sender-side (``Failure.SENDER``, the ESP's own message verbatim): the organization is paused;
- 408, 425, 429, 5xx, and a connection that could not be made (refused, DNS, connect timeout, TLS)
  -> ``transient``: nothing was sent, try again later without spending an attempt and without
  pausing (after ``retry_after``, the ESP's Retry-After, when it gave one);
- the request went out but no answer came back (read timeout, connection dropped) -> ``unknown``: the
  ESP may have accepted it, so it must not be sent again (as an SMTP connection lost after DATA).

The HTTP part of that (which statuses, which network failures) is integrations.retry's rule; what
is left here is the ESP's own: refused recipients, and a 2xx whose answer could not be read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from email.message import EmailMessage as MimeMessage
from typing import Any

import requests
from anymail.exceptions import (
    AnymailError,
    AnymailInvalidAddress,
    AnymailRecipientsRefused,
)
from django.core.exceptions import ImproperlyConfigured
from django.core.mail import EmailMultiAlternatives
from django.core.mail.backends.base import BaseEmailBackend
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _

from integrations import http, retry
from integrations.email.bounces import Failure, SmtpFailure
from integrations.outbound import OutboundURLError
from integrations.text import excerpt

# provider -> (anymail backend, the constructor kwarg that carries the credential)
BACKENDS: dict[str, tuple[str, str]] = {
    "postmark": ("anymail.backends.postmark.EmailBackend", "server_token"),
    "sendgrid": ("anymail.backends.sendgrid.EmailBackend", "api_key"),
    "mailgun": ("anymail.backends.mailgun.EmailBackend", "api_key"),
    "brevo": ("anymail.backends.brevo.EmailBackend", "api_key"),
}
# Carried by the API's own fields (or set by the ESP), never as extra headers.
_NOT_EXTRA = frozenset(
    {
        "from",
        "to",
        "cc",
        "bcc",
        "subject",
        "date",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
    }
)
CONNECT_TIMEOUT = 5.0
# anymail's per-recipient statuses that mean the ESP will not deliver to that address.
_REFUSED = frozenset({"invalid", "rejected"})


@dataclass(frozen=True)
class EspAccount:
    """An organization's ESP account; the key is decrypted by the caller just before use."""

    provider: str
    api_key: str = field(repr=False)  # never in a job payload, a log line or a traceback
    api_url: str = ""  # empty: the provider's default


@dataclass(frozen=True)
class EspResult:
    """What the ESP said about one message: accepted (message_id), or why not."""

    message_id: str = ""
    reply: str = ""  # on success: the ESP's name, status and message id, for the message's record
    failure: SmtpFailure | None = None  # HARD_BOUNCE (the recipient) or SENDER (our account/request)
    transient: str = ""  # nothing was sent; the same call may succeed later
    unknown: str = ""  # the request went out and no answer came back: never send it again
    retry_after: float | None = None  # with `transient`: seconds the ESP asked to wait (Retry-After)

    @property
    def sent(self) -> bool:
        return not (self.failure or self.transient or self.unknown)


def backend_for(*, provider: str, api_key: str, api_url: str = "", timeout: float = 30) -> BaseEmailBackend:
    """A fresh anymail backend for one account (its own HTTP session; nothing read from settings)."""
    try:
        path, credential = BACKENDS[provider]
    except KeyError:
        raise ValueError(f"unknown email provider {provider!r}") from None
    kwargs: dict[str, Any] = {credential: api_key, "timeout": (min(CONNECT_TIMEOUT, timeout), timeout)}
    if api_url:
        kwargs["api_url"] = api_url
    backend: BaseEmailBackend = import_string(path)(**kwargs)
    # anymail uses a session it finds open (and leaves it open): ours, through the outbound guard.
    backend.session = http.requests_session()  # type: ignore[attr-defined]
    return backend


def to_django(message: MimeMessage) -> EmailMultiAlternatives:
    """The stdlib message as Django's: subject, from, to, text body, HTML alternative, other headers."""
    text_part = message.get_body(("plain",))
    html_part = message.get_body(("html",))
    text = text_part.get_content() if isinstance(text_part, MimeMessage) else ""
    headers = {name: str(value) for name, value in message.items() if name.lower() not in _NOT_EXTRA}
    mail = EmailMultiAlternatives(
        subject=str(message["Subject"] or ""),
        body=text,
        from_email=str(message["From"]),
        to=[str(address) for address in message.get_all("To", [])],
        headers=headers,
    )
    if isinstance(html_part, MimeMessage):
        mail.attach_alternative(html_part.get_content(), "text/html")
    return mail


# Marketing mail goes to the ESP's bulk stream where it has one (Postmark refuses broadcasts on its
# transactional stream); provider -> anymail esp_extra.
_BULK_EXTRA: dict[str, dict[str, Any]] = {"postmark": {"MessageStream": "broadcast"}}


def send(
    *,
    provider: str,
    api_key: str,
    api_url: str,
    message: MimeMessage,
    timeout: float = 30,
    bulk: bool = True,
) -> EspResult:
    """Send one message (one recipient, as campaigns send) through the organization's ESP account;
    never raises for what the ESP or the network did. `bulk`: marketing mail (campaigns), sent on
    the provider's broadcast stream; False for one-off mail (a survey, a test email)."""
    esp_name = provider
    backend: BaseEmailBackend | None = None
    try:
        backend = backend_for(provider=provider, api_key=api_key, api_url=api_url, timeout=timeout)
        esp_name = str(getattr(backend, "esp_name", provider))
        mail = to_django(message)
        if bulk and provider in _BULK_EXTRA:
            mail.esp_extra = _BULK_EXTRA[provider]  # type: ignore[attr-defined]  # read by anymail
        backend.send_messages([mail])
    except AnymailError as exc:
        return classify(exc, esp_name=esp_name)
    except (ImproperlyConfigured, OutboundURLError) as exc:
        # anymail's AnymailConfigurationError, or an API URL the outbound guard refused: nothing
        # was sent, and nothing will be until the settings change.
        return EspResult(failure=SmtpFailure(Failure.SENDER, None, None, f"{esp_name}: {exc}"))
    finally:
        if backend is not None:
            backend.session.close()  # type: ignore[attr-defined]
    status = mail.anymail_status  # type: ignore[attr-defined]  # set by anymail on send
    statuses = set(status.status or ())
    if statuses & _REFUSED:
        # anymail raises only when it can match every recipient to a refusal; an answer it could not
        # fully match (an address the ESP quoted differently) still names the one recipient refused.
        refused = AnymailRecipientsRefused(response=status.esp_response)
        return EspResult(failure=_failure(Failure.HARD_BOUNCE, refused, esp_name, _status_of(refused)))
    message_id = str(status.message_id or "")
    statuses_text = "/".join(sorted(statuses)) or "sent"
    return EspResult(message_id=message_id, reply=f"{esp_name} {statuses_text}: {message_id}".strip(": "))


def send_test_email(*, provider: str, api_key: str, api_url: str, sender: str, to: str) -> EspResult:
    """The admin's test email, through the ESP; the result carries the ESP's answer."""
    message = MimeMessage()
    message["From"], message["To"] = sender, to
    message["Subject"] = "Teste de envio — CRM"
    message.set_content(
        "Se você recebeu esta mensagem, o envio de e-mails da sua organização está funcionando."
    )
    return send(provider=provider, api_key=api_key, api_url=api_url, message=message, bulk=False)


def classify(exc: AnymailError, *, esp_name: str) -> EspResult:
    """What an anymail exception means for the recipient and the sender (pure)."""
    status = _status_of(exc)
    if isinstance(exc, AnymailRecipientsRefused):
        return EspResult(failure=_failure(Failure.HARD_BOUNCE, exc, esp_name, status))
    if isinstance(exc, AnymailInvalidAddress) and "in `to`" in _text(exc):
        # Only the recipient's address: one the sender's account cannot use must not bounce everyone.
        return EspResult(failure=SmtpFailure(Failure.HARD_BOUNCE, None, None, f"{esp_name}: {_text(exc)}"))
    if status is None and isinstance(exc, requests.RequestException):
        verdict = retry.for_transport(retry.requests_transport(exc), idempotent=False).verdict
        if verdict is retry.Verdict.RETRY:
            return EspResult(transient=f"{esp_name} API unreachable: {_cause(exc)}")
        if verdict is retry.Verdict.PERMANENT:
            return EspResult(failure=SmtpFailure(Failure.SENDER, None, None, f"{esp_name}: {_cause(exc)}"))
        return EspResult(unknown=f"{esp_name}: no answer after the request was sent: {_cause(exc)}")
    if status is None:
        # Refused by anymail before the API was called (an unsupported feature, a setting).
        return EspResult(failure=SmtpFailure(Failure.SENDER, None, None, f"{esp_name}: {_text(exc)}"))
    if 300 <= status < 400:
        # Never followed (the API URL answers elsewhere): where it points and what it says stay out.
        refused = _("the API answered with a redirect, which is not followed")
        message = f"{esp_name}: HTTP {status}: {refused}"
        return EspResult(failure=SmtpFailure(Failure.SENDER, status, None, message))
    response = getattr(exc, "response", None)
    decision = retry.for_status(status, retry_after_header=_header(response, "Retry-After"))
    if decision.verdict is retry.Verdict.OK:
        # Accepted, but the answer could not be read: the message may well be on its way.
        return EspResult(unknown=_failure(Failure.SENDER, exc, esp_name, status).message)
    if decision.retryable:
        return EspResult(
            transient=f"{status} {_failure(Failure.SENDER, exc, esp_name, status).message}",
            retry_after=decision.delay,
        )
    # 401/403 (the key) and anything else the API refused: our account or our request is at fault.
    return EspResult(failure=_failure(Failure.SENDER, exc, esp_name, status))


def _status_of(exc: AnymailError) -> int | None:
    status: int | None = getattr(exc, "status_code", None) or getattr(
        getattr(exc, "response", None), "status_code", None
    )
    return status


def _header(response: object, name: str) -> str | None:
    headers = getattr(response, "headers", None)
    value = headers.get(name) if headers is not None else None
    return value if isinstance(value, str) else None


def _text(exc: BaseException) -> str:
    return str(exc.args[0]) if exc.args else type(exc).__name__


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}"


def _failure(kind: Failure, exc: AnymailError, esp_name: str, status: int | None) -> SmtpFailure:
    """The ESP's own error code and message verbatim, as a failure with the HTTP status as its code."""
    code, text = _esp_error(exc.response)
    if not text:
        text = excerpt(_text(exc))
    if status is not None and 200 <= status < 300:
        status = None  # e.g. Postmark's 200 "will not deliver to these inactive addresses"
    label = f"{esp_name} error {code}" if code not in (None, "") else esp_name
    return SmtpFailure(kind=kind, code=status, enhanced=None, message=f"{label}: {text}")


def _esp_error(response: requests.Response | None) -> tuple[Any, str]:
    """(the ESP's error code, its message) from an API response: Postmark's ErrorCode/Message,
    Brevo's code/message, Mailgun's message, SendGrid's errors[].message, else the body."""
    if response is None:
        return None, ""
    try:
        body = response.json()
    except (ValueError, json.JSONDecodeError):
        return None, excerpt(response.text or response.reason or "")
    if not isinstance(body, dict):
        return None, excerpt(json.dumps(body))
    code = body.get("ErrorCode", body.get("code"))
    text = body.get("Message") or body.get("message") or body.get("error") or ""
    errors = body.get("errors")
    if not text and isinstance(errors, list):
        text = "; ".join(str(e.get("message", e)) if isinstance(e, dict) else str(e) for e in errors)
    return code, excerpt(str(text or json.dumps(body)))
