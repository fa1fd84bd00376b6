"""Handing one email to the organization's SMTP server or ESP, the same for every sender: its transport
(credentials decrypted in memory only), the message with its one-click unsubscribe headers, and
`deliver`, which classifies what was answered into a `Delivery` for messaging.decisions.email."""

from __future__ import annotations

import smtplib
from collections.abc import Callable
from dataclasses import dataclass
from email.headerregistry import Address
from email.message import EmailMessage as MimeMessage
from email.utils import format_datetime, make_msgid

from django.conf import settings
from django.utils import timezone

from integrations.email import esp, pool
from integrations.email.bounces import Failure, SmtpFailure, classify_exception
from integrations.email.smtp import OutcomeUnknown, SmtpServer
from integrations.models import EmailSettings
from integrations.text import fold_whitespace
from messaging.email_render import RenderedEmail


def smtp_server(email_settings: EmailSettings) -> SmtpServer:
    """The organization's server with its password decrypted in memory (never in a payload or log)."""
    return SmtpServer(
        host=email_settings.host,
        port=email_settings.port,
        security=email_settings.security,
        username=email_settings.username,
        password=email_settings.get_password(),
    )


def esp_account(email_settings: EmailSettings) -> esp.EspAccount:
    """The organization's ESP account with its API key decrypted in memory (never in a payload or log)."""
    return esp.EspAccount(
        provider=email_settings.provider,
        api_key=email_settings.get_esp_api_key(),
        api_url=email_settings.esp_api_url,
    )


def email_transport(email_settings: EmailSettings) -> SmtpServer | esp.EspAccount:
    """Where `deliver` hands the organization's messages: its SMTP server or its ESP account."""
    if email_settings.provider == EmailSettings.Provider.SMTP:
        return smtp_server(email_settings)
    return esp_account(email_settings)


def build_message(
    *,
    email_settings: EmailSettings,
    to_name: str,
    to_address: str,
    rendered: RenderedEmail,
    unsubscribe_url: str = "",
) -> MimeMessage:
    """A multipart/alternative message (text + HTML) with the RFC 8058 one-click headers."""
    message = MimeMessage()
    message["From"] = Address(email_settings.sender_name, addr_spec=email_settings.sender_email)
    # A name with a line break (typed, or from an ERP) would make the header invalid and fail the job.
    message["To"] = Address(fold_whitespace(to_name), addr_spec=to_address)
    message["Subject"] = rendered.subject
    message["Date"] = format_datetime(timezone.now())
    message["Message-ID"] = make_msgid(domain=email_settings.sender_email.rpartition("@")[2] or None)
    if unsubscribe_url:
        targets = [f"<{unsubscribe_url}>"]
        if email_settings.unsubscribe_mailto:
            targets.append(f"<mailto:{email_settings.unsubscribe_mailto}?subject=unsubscribe>")
        message["List-Unsubscribe"] = ", ".join(targets)
        message["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    message.set_content(rendered.text)
    message.add_alternative(rendered.html, subtype="html")
    return message


@dataclass
class Delivery:
    """What happened to one message handed to the server."""

    reply: str = ""
    failure: SmtpFailure | None = None
    unknown: str = ""  # the connection broke after the hand-over
    message_id: str = ""  # the ESP's id for the message (its tracking webhooks name it so)
    transient: str = ""  # the ESP cannot take it now (429, 5xx, unreachable): nothing was sent
    retry_after: float | None = None  # with `transient`: seconds the ESP asked to wait (Retry-After)
    unsendable: str = ""  # the message could not be built (an invalid header): it never will be


def deliver(
    server: SmtpServer | esp.EspAccount,
    build: Callable[[], MimeMessage],
    *,
    bulk: bool = True,
    ready: Callable[[], bool] | None = None,
) -> Delivery | None:
    """Send over the process's pooled connection (or the ESP's API) and classify what was answered.
    `bulk`: marketing mail (the ESP's broadcast stream); False for a one-off message. `ready`: called
    right before the hand-over, once the connection is open (see pool.send); when it answers False
    nothing is sent and None is returned."""
    if isinstance(server, esp.EspAccount):
        if ready is not None and not ready():
            return None
        result = esp.send(
            provider=server.provider,
            api_key=server.api_key,
            api_url=server.api_url,
            message=build(),
            bulk=bulk,
        )
        return Delivery(
            reply=result.reply,
            failure=result.failure,
            unknown=result.unknown,
            message_id=result.message_id,
            transient=result.transient,
            retry_after=result.retry_after,
        )
    try:
        reply = pool.send(server, build, idle_check=settings.EMAIL_CONNECTION_IDLE_CHECK, ready=ready)
        return None if reply is None else Delivery(reply=reply)
    except OutcomeUnknown as exc:
        return Delivery(unknown=str(exc))
    except (smtplib.SMTPException, OSError) as exc:
        failure = classify_exception(exc)
        if failure.kind is Failure.SENDER:
            pool.discard(server)
        return Delivery(failure=failure)
