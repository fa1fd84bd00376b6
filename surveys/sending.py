"""Sending one survey, by email or WhatsApp, exactly once: claimed (SCHEDULED -> SENDING) before
the provider is called, back to SCHEDULED only when nothing was handed over; the provider's answer
decided by messaging.decisions like every sender's."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import F, Q
from django.template.loader import render_to_string
from django.utils import timezone, translation

from crm import aio, ratelimit
from crm.jobs import Defer
from crm.models import Customer, OptOutSource, Organization
from crm.names import first_name
from crm.services import customers_opt_out, organizations_pause
from integrations.clients import graph_client
from integrations.models import EmailSettings, WhatsappNumber
from integrations.services import whatsapp_numbers_pause
from integrations.whatsapp.client import SendResult, TemplateMessage, UrlButton
from integrations.whatsapp.phones import normalize_phone
from messaging import decisions, email_transport, pacing, suppression
from messaging.decisions import Verdict
from messaging.email_render import RenderedEmail
from messaging.email_transport import Delivery
from surveys import links
from surveys.models import OUTCOME_UNKNOWN, Survey
from surveys.services import (
    ATTEMPTS,
    FIRST_NAME_FALLBACK,
    LANGUAGE,
    MAX_SLOT_WAIT,
    PAUSED_DELAY,
    THROTTLE_DELAY,
    WHATSAPP_LANGUAGE,
    Channel,
    SurveyRetry,
)

if TYPE_CHECKING:
    from email.message import EmailMessage as MimeMessage

    from integrations.email.esp import EspAccount
    from integrations.email.smtp import SmtpServer

Status = Survey.Status
logger = logging.getLogger(__name__)

# --- Sending -------------------------------------------------------------------------------------


def render_survey_email(survey: Survey) -> RenderedEmail:
    """The survey email (Portuguese): subject, HTML and text bodies with the survey's https link."""
    context = {
        "first_name": first_name(survey.customer.name or ""),
        "organization": survey.organization.name,
        "store": survey.store.name,
        "url": links.survey_url(survey),
    }
    with translation.override(LANGUAGE):
        subject = render_to_string("surveys/email_subject.txt", context)
        text = render_to_string("surveys/email.txt", context)
        html = render_to_string("surveys/email.html", context)
    return RenderedEmail(subject=" ".join(subject.split()), html=html, text=text)


def survey_send(*, survey_id: int) -> str:
    """Send one due survey on its channel; returns the outcome (sent, skipped, failed, cancelled...).

    Safe to run twice or on two workers: only a SCHEDULED survey is claimed, and it goes back to
    SCHEDULED only when nothing was handed to the provider. Raises Defer (no attempt spent) while
    the organization's channel is paused or the rate limit is far ahead, and SurveyRetry on a soft
    bounce or a retryable provider error (an attempt spent: RQ retries with its backoff).
    """
    survey = Survey.objects.select_related("organization").filter(pk=survey_id).first()
    if survey is None or survey.status != Status.SCHEDULED:
        return "nothing to do"
    org = survey.organization
    now = timezone.now()
    if survey.due_at > now:
        return "not due"  # made later since it was dispatched; the dispatch cron sends it when due
    if org.survey_channel not in Channel.values:
        Survey.objects.filter(pk=survey_id, status=Status.SCHEDULED).update(
            status=Status.CANCELLED, reason="post-sale surveys were turned off for the organization"
        )
        return "cancelled"
    _defer_if_paused(org, survey.channel)
    with transaction.atomic():
        # One survey of a customer at a time: a second one waits here, then sees the first as
        # sending (or sent) and is skipped by the cool-down.
        list(Customer.objects.select_for_update().filter(pk=survey.customer_id).values_list("pk"))
        claimed = Survey.objects.filter(pk=survey_id, status=Status.SCHEDULED).update(
            status=Status.SENDING, attempts=F("attempts") + 1, sending_at=now
        )
        if not claimed:
            return "nothing to do"
        survey = Survey.objects.select_related("organization", "customer", "store").get(pk=survey_id)
        reason = _skip_reason(survey, now)
        if reason:
            Survey.objects.filter(pk=survey_id, status=Status.SENDING).update(
                status=Status.SKIPPED, reason=reason
            )
    if reason:
        logger.info("survey %s skipped: %s", survey_id, reason, extra={"organization_id": org.pk})
        return "skipped"
    if survey.channel == Channel.EMAIL:
        return _send_email(survey)
    return _send_whatsapp(survey)


def _defer_if_paused(org: Organization, channel: str) -> None:
    if channel == Channel.EMAIL and org.email_paused_at:
        raise Defer(PAUSED_DELAY, f"organization's email sending paused: {org.email_paused_reason}")
    if channel == Channel.WHATSAPP and org.whatsapp_paused_at:
        raise Defer(PAUSED_DELAY, f"organization's WhatsApp sending paused: {org.whatsapp_paused_reason}")


def _skip_reason(survey: Survey, now: datetime) -> str:
    """Why this customer must not get this survey, or ""."""
    if survey.channel == Channel.EMAIL:
        reason = _email_skip_reason(survey)
    else:
        reason = _whatsapp_skip_reason(survey.customer)
    return reason or _cooldown_reason(survey, now)


def _email_skip_reason(survey: Survey) -> str:
    """Consent and a deliverable, unsuppressed address."""
    customer = survey.customer
    if customer.email_opted_out_at is not None:
        return "customer opted out of email"
    if not customer.marketing_consent:
        return "customer has no marketing consent"
    address = customer.email.strip()
    if not address:
        return "customer has no email address"
    try:
        validate_email(address)
    except ValidationError:
        return f"invalid email address {address!r}"
    if suppression.suppressed_addresses(organization_id=survey.organization_id, addresses=[address]):
        return suppression.SUPPRESSED
    return ""


def _whatsapp_skip_reason(customer: Customer) -> str:
    """Consent and a valid phone number."""
    if customer.whatsapp_opted_out_at is not None:
        return "customer opted out of WhatsApp"
    if not customer.marketing_consent:
        return "customer has no marketing consent"
    if not customer.phone.strip():
        return "customer has no phone number"
    if normalize_phone(customer.phone) is None:
        return f"invalid phone number {customer.phone!r}"
    return ""


def _cooldown_reason(survey: Survey, now: datetime) -> str:
    """The organization's cool-down: another survey of the customer sent within it, or being sent."""
    org = survey.organization
    if not org.survey_cooldown_days:
        return ""
    since = now - timedelta(days=org.survey_cooldown_days)
    last = (
        Survey.objects.filter(customer_id=survey.customer_id)
        .filter(Q(status__in=Survey.SURVEYED, sent_at__gte=since) | Q(status=Status.SENDING))
        .exclude(pk=survey.pk)
        .order_by(F("sent_at").desc(nulls_first=True))
        .values_list("sent_at", flat=True)[:1]
    )
    if not last:
        return ""
    when = last[0]
    if when is None:
        return "another survey is being sent to this customer"
    return (
        f"surveyed on {timezone.localtime(when):%Y-%m-%d}, within the "
        f"{org.survey_cooldown_days}-day cool-down"
    )


def _release(survey: Survey) -> None:
    """Nothing was handed over: back to SCHEDULED without spending the attempt (a Defer follows)."""
    Survey.objects.filter(pk=survey.pk, status=Status.SENDING).update(
        status=Status.SCHEDULED, sending_at=None, attempts=F("attempts") - 1
    )


def _retry_or_fail(survey: Survey, reason: str) -> bool:
    """An attempt that may work later: back to SCHEDULED while attempts are left (True), else FAILED."""
    if survey.attempts < ATTEMPTS:
        Survey.objects.filter(pk=survey.pk, status=Status.SENDING).update(
            status=Status.SCHEDULED, sending_at=None, reason=reason[:2000]
        )
        return True
    _fail(survey, reason)
    return False


def _fail(survey: Survey, reason: str) -> None:
    Survey.objects.filter(pk=survey.pk, status=Status.SENDING).update(
        status=Status.FAILED, reason=reason[:2000]
    )
    logger.warning(
        "survey %s failed: %s", survey.pk, reason, extra={"organization_id": survey.organization_id}
    )


def _mark_sent(survey: Survey, reference: str) -> None:
    now = timezone.now()
    sent = Survey.objects.filter(pk=survey.pk, status=Status.SENDING).update(
        status=Status.SENT, sent_at=now, provider_reference=reference[:255], reason=""
    )
    if not sent:  # answered while its send was in flight: the answer stays, the send is recorded
        Survey.objects.filter(pk=survey.pk, sent_at__isnull=True).update(
            sent_at=now, provider_reference=reference[:255]
        )


def _wait_for_slot(key: str, per_second: float, survey: Survey) -> None:
    """Take a slot of the organization's (or number's) rate shared with campaigns, or Defer."""
    slots = ratelimit.reserve(key, 1, per_second)
    if slots.start > MAX_SLOT_WAIT:
        _release(survey)
        raise Defer(slots.start, f"rate limit: next slot in {slots.start:.0f}s")
    if slots.start > 0:
        time.sleep(slots.start)


@contextmanager
def _failed_attempt_on_error(survey: Survey) -> Iterator[None]:
    """Nothing is handed over in the block: an error there is a failed attempt, retried like any other
    (FAILED once attempts run out), and raised again. A Defer passes through."""
    try:
        yield
    except Defer:
        raise
    except Exception as exc:
        _retry_or_fail(survey, f"{type(exc).__name__}: {exc}")
        raise


def _send_email(survey: Survey) -> str:
    """Hand the survey email to the organization's SMTP server or ESP, at its rate; record the outcome."""
    email_settings, server, message = _email_prepared(survey)

    def on_time() -> bool:
        # The slot is taken once the connection is open, so connecting never eats into it.
        with _failed_attempt_on_error(survey):
            per_second = email_settings.messages_per_minute / 60
            _wait_for_slot(pacing.email_key(survey.organization_id), per_second, survey)
        return True

    # bulk=False: one message about the customer's purchase, not a broadcast
    outcome = email_transport.deliver(server, lambda: message, bulk=False, ready=on_time)
    assert outcome is not None  # `on_time` never answers no (it raises Defer instead)
    return _email_outcome(survey, outcome)


def _email_prepared(survey: Survey) -> tuple[EmailSettings, SmtpServer | EspAccount, MimeMessage]:
    """The organization's email settings read fresh, its transport (SMTP server or ESP, credentials
    decrypted in memory) and the message. Defers, the organization's email paused, without settings."""
    with _failed_attempt_on_error(survey):
        email_settings = EmailSettings.objects.filter(organization_id=survey.organization_id).first()
        if email_settings is None:
            organizations_pause(
                organization_ids=[survey.organization_id], channel="email", reason="no email settings"
            )
            _release(survey)
            raise Defer(PAUSED_DELAY, "organization has no email settings")
        server = email_transport.email_transport(email_settings)
        message = email_transport.build_message(
            email_settings=email_settings,
            to_name=survey.customer.name,
            to_address=survey.customer.email.strip(),
            rendered=render_survey_email(survey),
        )
    return email_settings, server, message


def _email_outcome(survey: Survey, outcome: Delivery) -> str:
    """Record what the server (or ESP) answered as every sender decides it (messaging.decisions.email);
    raises Defer or SurveyRetry when the send waits. An unknown outcome is never resent."""
    decision = decisions.email(outcome, attempts=survey.attempts, max_attempts=ATTEMPTS)
    settled = _settled(survey, decision, channel="email", reference=outcome.reply)
    if settled:
        return settled
    if decision.verdict is Verdict.RELEASE:
        raise Defer(settings.EMAIL_RETRY_BACKOFF, decision.reason)
    if decision.verdict is Verdict.RETRY:
        _retry_or_fail(survey, f"soft bounce: {decision.reason}")
        raise SurveyRetry(f"soft bounce: {decision.reason}")
    return _email_refused(survey, decision)


def _settled(
    survey: Survey, decision: decisions.Decision, *, channel: Literal["whatsapp", "email"], reference: str
) -> str:
    """What both channels record alike: sent, an unknown outcome (failed, never resent), and the
    survey released (no attempt spent), raising Defer when the organization's channel is paused
    for it. "" when the channel's own handling follows."""
    if decision.verdict is Verdict.SENT:
        _mark_sent(survey, reference)
        return "sent"
    if decision.verdict is Verdict.UNKNOWN:
        _fail(survey, f"{OUTCOME_UNKNOWN} ({decision.reason})")
        return "failed"
    if decision.verdict is Verdict.RELEASE:
        _release(survey)
        if decision.pause_organization:
            reason = decision.pause_organization
            organizations_pause(organization_ids=[survey.organization_id], channel=channel, reason=reason)
            label = "WhatsApp" if channel == "whatsapp" else channel
            raise Defer(PAUSED_DELAY, f"{label} sending paused: {reason}")
    return ""


def _email_refused(survey: Survey, decision: decisions.Decision) -> str:
    text = decision.reason
    if decision.blocked:
        # The receiving server's policy refused it (blocklist, reputation): the address is kept.
        _fail(survey, f"blocked: {text}")
    elif decision.bounce == "soft":
        _fail(survey, f"soft bounce: {text}")
    else:
        _fail(survey, f"hard bounce: {text}")
        suppression.addresses_suppress(
            organization_id=survey.organization_id, entries=[(survey.customer.email, text)]
        )
    return "failed"


def _whatsapp_number(survey: Survey) -> WhatsappNumber | None:
    """The number the sale's store sends from (Store.whatsapp_number), else one of its own, else the
    organization's first one."""
    numbers = list(WhatsappNumber.objects.filter(organization_id=survey.organization_id).order_by("pk"))
    sending = survey.store.whatsapp_number_id if survey.store_id else None
    return next(
        (n for n in numbers if n.pk == sending),
        next((n for n in numbers if n.store_id == survey.store_id), numbers[0] if numbers else None),
    )


def _send_whatsapp(survey: Survey) -> str:
    """Send the survey template from the store's number (at the number's rate) and record Meta's answer."""
    template = survey.organization.survey_whatsapp_template.strip()
    number = _whatsapp_number(survey)
    if not template or number is None:
        _fail(
            survey,
            "the organization has no WhatsApp survey template" if not template else "no WhatsApp number",
        )
        return "failed"
    if number.paused_at:
        _release(survey)
        raise Defer(PAUSED_DELAY, f"WhatsApp number paused: {number.paused_reason}")
    with _failed_attempt_on_error(survey):
        token = number.get_access_token()  # fresh, decrypted in memory only
        client = graph_client(number.graph_url or settings.WHATSAPP_GRAPH_URL)
        _wait_for_slot(pacing.whatsapp_key(number.pk), number.messages_per_second, survey)
    result = aio.run(
        client.send_template(
            phone_number_id=number.phone_number_id,
            access_token=token,
            message=_survey_template(survey, template),
        )
    )
    del token
    return _whatsapp_outcome(survey, number, result)


def _survey_template(survey: Survey, template: str) -> TemplateMessage:
    phone = normalize_phone(survey.customer.phone)
    assert phone is not None  # checked by _skip_reason
    return TemplateMessage(
        to=phone.lstrip("+"),
        template=template,
        language=WHATSAPP_LANGUAGE,
        body=[first_name(survey.customer.name or "") or FIRST_NAME_FALLBACK],
        # The template's URL button is "https://<our host>/{{1}}": its suffix is the survey's path.
        buttons=[UrlButton(0, links.survey_path(survey))],
        biz_opaque_callback_data=f"s:{survey.pk}",
    )


def _whatsapp_outcome(survey: Survey, number: WhatsappNumber, result: SendResult) -> str:
    """Record Meta's answer as every sender decides it (messaging.decisions.whatsapp); raises Defer
    (account, number or rate limit) or SurveyRetry when it waits. An unknown outcome is never resent."""
    decision = decisions.whatsapp(result, attempts=survey.attempts, max_attempts=ATTEMPTS)
    settled = _settled(survey, decision, channel="whatsapp", reference=result.wamid)
    if settled:
        return settled
    if decision.verdict is Verdict.RELEASE:
        if decision.pause_number:
            reason = decision.pause_number
            whatsapp_numbers_pause(
                organization_id=survey.organization_id, number_ids=[number.pk], reason=reason
            )
            raise Defer(PAUSED_DELAY, f"WhatsApp number paused: {reason}")
        raise Defer(max(THROTTLE_DELAY, result.retry_after or 0), f"WhatsApp throttled: {decision.reason}")
    if decision.verdict is Verdict.RETRY:
        _retry_or_fail(survey, decision.reason)
        raise SurveyRetry(decision.reason)
    if decision.opt_out:
        customers_opt_out(customer_ids=[survey.customer_id], channel="whatsapp", source=OptOutSource.PROVIDER)
    _fail(survey, decision.reason)
    return "failed"
