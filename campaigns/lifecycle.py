"""A campaign's life: validate, start, schedule, pause, resume, cancel, stop, retry, archive, complete."""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext as _

from campaigns import audience, lift, links, selectors
from campaigns.composer import template_problem
from campaigns.models import (
    OUTCOME_UNKNOWN,
    BounceType,
    Campaign,
    CampaignMetric,
    Channel,
    EmailMessage,
    Kind,
    WhatsappMessage,
)
from campaigns.variables import VARIABLE_SOURCES
from crm import jobs, promote, queues, recovery
from crm.checkpoints import jobrun_enqueue
from integrations.models import EmailSettings
from integrations.services import whatsapp_price_currency
from messaging import email_render

logger = logging.getLogger(__name__)

Status = Campaign.Status
MsgStatus = WhatsappMessage.Status


class CampaignError(ValueError):
    """An operator action that does not apply to the campaign as it is."""


class EmptyAudience(CampaignError):
    """Nobody would receive the campaign (the message says why): it does not start."""


Message = WhatsappMessage | EmailMessage


# How each channel's messages are sent: (message model, send job, queue, job id prefix, batch size).
def _channel(channel: str) -> tuple[type[Message], str, str, str, int]:
    if channel == Channel.EMAIL:
        return (
            EmailMessage,
            "campaigns.tasks.email_send_batch",
            queues.EMAIL_SEND,
            "em",
            int(settings.EMAIL_BATCH_SIZE),
        )
    return (
        WhatsappMessage,
        "campaigns.tasks.whatsapp_send_batch",
        queues.WHATSAPP_SEND,
        "wa",
        int(settings.WHATSAPP_BATCH_SIZE),
    )


def _channel_of(campaign_id: int) -> str:
    return (
        Campaign.objects.filter(pk=campaign_id).values_list("channel", flat=True).first() or Channel.WHATSAPP
    )


def batch_job_id(campaign_id: int, batch: int, channel: str = Channel.WHATSAPP) -> str:
    return jobs.make_job_id(_channel(channel)[3], campaign_id, batch)


# Fields whose values every message is built from: their validators are checked again at the start
# (a value saved before a validator existed would fail every send).
_SEND_FIELDS = frozenset({"audience_purchased_within_days", "email_subject"})


def campaign_validate(*, campaign: Campaign) -> None:
    """Raise CampaignError when the campaign cannot be sent as configured."""
    try:
        campaign.clean_fields(exclude={f.name for f in Campaign._meta.fields if f.name not in _SEND_FIELDS})
    except ValidationError as exc:
        raise CampaignError(
            "; ".join(f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items())
        ) from None
    if campaign.channel == Channel.EMAIL:
        _validate_email(campaign)
        return
    if campaign.whatsapp_number_id is None:
        raise CampaignError(_("choose the WhatsApp number to send from"))
    if not campaign.template_name:
        raise CampaignError(_("the template name is required"))

    unknown = [v for v in campaign.template_variables if v not in VARIABLE_SOURCES]
    if unknown:
        raise CampaignError(
            _("unknown template variable source(s): %(unknown)s; use %(known)s")
            % {"unknown": ", ".join(map(str, unknown)), "known": ", ".join(VARIABLE_SOURCES)}
        )
    if campaign.redirect_button_index is not None and not campaign.redirect_url:
        raise CampaignError(_("a redirect button needs a redirect URL"))

    problem = template_problem(campaign)
    if problem:
        raise CampaignError(problem)


def _validate_email(campaign: Campaign) -> None:

    email_settings = EmailSettings.objects.filter(organization_id=campaign.organization_id).first()
    if email_settings is None:
        raise CampaignError(_("the organization has no email settings: add them under Integrations"))
    try:
        email_settings.clean_fields(
            exclude={f.name for f in EmailSettings._meta.fields if f.name != "sender_name"}
        )
    except ValidationError as exc:
        raise CampaignError(
            _("the email settings' sender name: %(error)s") % {"error": " ".join(exc.messages)}
        ) from None
    try:
        email_render.compile_email(
            subject=campaign.email_subject, body=campaign.email_body, body_format=campaign.email_body_format
        )
    except email_render.TemplateError as exc:
        raise CampaignError(str(exc)) from None


def campaign_start(*, campaign: Campaign) -> Campaign:
    """Move a draft or scheduled campaign to sending and enqueue its fan-out; returns at once.
    EmptyAudience when nobody would receive it (never "sent" to nobody)."""
    campaign_validate(campaign=campaign)
    problem = audience.audience_problem(campaign=campaign)
    if problem:
        raise EmptyAudience(problem)
    with transaction.atomic():
        now = timezone.now()
        # The row locked, its content read fresh: the links frozen are those of what is sent.
        fresh = Campaign.objects.select_for_update().filter(pk=campaign.pk).first()
        updated = Campaign.objects.filter(pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED]).update(
            status=Status.SENDING,
            started_at=now,
            finished_at=None,
            stop_reason="",
            sent_links=links.link_targets(campaign=fresh) if fresh is not None else None,
        )
        if not updated:
            campaign.refresh_from_db()
            raise CampaignError(
                _("campaign %(id)s is %(status)s; only a draft or scheduled campaign can start")
                % {"id": campaign.pk, "status": campaign.get_status_display()}
            )
        # Its costs add up in the rate card's currency as it is now (one currency per total).
        CampaignMetric.objects.get_or_create(
            campaign=campaign, defaults={"cost_currency": whatsapp_price_currency()}
        )
        jobrun_enqueue(
            kind="campaign-fanout",
            key=str(campaign.pk),
            func="campaigns.tasks.campaign_fanout",
            queue=queues.CAMPAIGN_TRIGGER,
            kwargs={"campaign_id": campaign.pk},
            organization_id=campaign.organization_id,
        )
    campaign.refresh_from_db()
    return campaign


def trigger_job_id(campaign_id: int) -> str:
    return jobs.make_job_id("campaign", campaign_id)


def campaign_schedule(*, campaign: Campaign, at: datetime) -> Campaign:
    """Schedule (or reschedule) a draft/scheduled campaign to start at `at`.

    One delayed job with the fixed id campaign-<id> on campaign-trigger: rescheduling replaces
    it, so there are never two."""
    if timezone.is_naive(at):
        raise CampaignError(_("the schedule needs a time zone"))
    if at <= timezone.now():
        raise CampaignError(_("the scheduled time is in the past; start it now instead"))
    campaign_validate(campaign=campaign)
    with transaction.atomic():
        if not Campaign.objects.filter(pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED]).update(
            status=Status.SCHEDULED, scheduled_at=at
        ):
            campaign.refresh_from_db()
            raise CampaignError(
                _("campaign %(id)s is %(status)s; only a draft can be scheduled")
                % {"id": campaign.pk, "status": campaign.get_status_display()}
            )
        jobs.enqueue(
            "campaigns.tasks.campaign_trigger",
            queue=queues.CAMPAIGN_TRIGGER,
            kwargs={"campaign_id": campaign.pk},
            job_id=trigger_job_id(campaign.pk),
            replace=True,
            at=at,
            organization_id=campaign.organization_id,
        )
    campaign.refresh_from_db()
    return campaign


def campaign_unschedule(*, campaign: Campaign) -> None:
    """Back to draft; the delayed start is removed."""
    Campaign.objects.filter(pk=campaign.pk, status=Status.SCHEDULED).update(
        status=Status.DRAFT, scheduled_at=None
    )
    jobs.delete_job(trigger_job_id(campaign.pk))
    campaign.refresh_from_db()


def _batch_specs(
    campaign_id: int, batches: list[int], channel: str, organization_id: int | None
) -> list[jobs.JobSpec]:
    _, func, queue, _, _ = _channel(channel)
    return [
        jobs.JobSpec(
            func=func,
            queue=queue,
            kwargs={"campaign_id": campaign_id, "batch": b},
            job_id=batch_job_id(campaign_id, b, channel),
            organization_id=organization_id,
        )
        for b in batches
    ]


def campaign_archive(*, campaign: Campaign) -> bool:
    """Hide the campaign from the default list, keeping its messages and credited sales; True when this
    call archived it. A campaign still sending (or paused) is refused: cancel it first."""
    if campaign.status in (Status.SENDING, Status.PAUSED):
        raise CampaignError(
            _("campaign %(id)s is %(status)s; cancel it before archiving")
            % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
    return bool(
        Campaign.objects.filter(pk=campaign.pk, archived_at__isnull=True)
        .exclude(status__in=[Status.SENDING, Status.PAUSED])
        .update(archived_at=timezone.now())
    )


def campaign_unarchive(*, campaign: Campaign) -> bool:
    """Show an archived campaign in the default list again; True when this call did it."""
    return bool(Campaign.objects.filter(pk=campaign.pk, archived_at__isnull=False).update(archived_at=None))


def campaign_has_messages(*, campaign: Campaign) -> bool:
    """Whether any message was written for the campaign (then it is history: archived, never deleted)."""
    return campaign.message_model.objects.filter(campaign_id=campaign.pk).exists()


def campaign_deleting(sender: type[Campaign], instance: Campaign, **kwargs: object) -> None:
    """pre_delete of a campaign, inside the deletion's transaction: its row locked before its
    messages are deleted. A fan-out page holds the row FOR KEY SHARE while it writes (the message
    rows have no foreign-key constraint to do it, see models.MESSAGE_FKS): a page under way
    finishes first and its messages are deleted with the others, and the next page finds the
    campaign gone."""
    list(Campaign.objects.select_for_update().filter(pk=instance.pk).values_list("pk", flat=True))


CUSTOMER_DELETED = "customer deleted"


def skip_without_customer(*, model: type[Message], campaign_id: int, ids: list[int], found: list) -> int:
    """Claimed messages (`ids`) that their customer's join left out of `found`: the customer was
    deleted while the fan-out wrote them (no foreign-key constraint, models.MESSAGE_FKS). They are
    SKIPPED and counted, so that the campaign completes. Returns how many."""
    gone = set(ids).difference(m.pk for m in found)
    if not gone:
        return 0
    with transaction.atomic():
        skipped = model.objects.filter(id__in=gone, status=MsgStatus.SENDING).update(
            status=MsgStatus.SKIPPED, error_reason=CUSTOMER_DELETED
        )
        CampaignMetric.objects.filter(campaign_id=campaign_id).update(skipped=F("skipped") + skipped)
    return skipped


def _queued_batches(model: type[Message], campaign_id: int) -> list[int]:
    return list(
        model.objects.filter(campaign_id=campaign_id, status=MsgStatus.QUEUED)
        .order_by("batch")
        .values_list("batch", flat=True)
        .distinct()
    )


PAUSED_DELAY = 30.0  # how often a paused campaign's batch looks again (twice that for a paused organization)


def batch_may_send(*, campaign: Campaign, batch: int) -> bool:
    """What every send batch checks first, with the campaign and its organization loaded.

    False when there is nothing to send: a cancelled or stopped campaign (the batch's queued
    messages are cancelled) or one not sending. Raises Defer (no attempt spent) while the campaign
    is paused or the organization's sending on the channel is paused."""
    model = _channel(campaign.channel)[0]
    if campaign.status in (Status.CANCELLED, Status.STOPPED):
        model.objects.filter(campaign_id=campaign.pk, batch=batch, status=MsgStatus.QUEUED).update(
            status=MsgStatus.CANCELLED
        )
        return False
    if campaign.status == Status.PAUSED:
        raise jobs.Defer(PAUSED_DELAY, "campaign paused")
    # Not sending_paused: a number Meta paused holds only its own messages, which the send job leaves.
    paused = selectors.organization_paused(campaign=campaign)
    if paused:
        raise jobs.Defer(PAUSED_DELAY * 2, f"organization's {campaign.channel} sending paused: {paused}")
    return campaign.status == Status.SENDING


def campaign_complete_if_done(*, campaign_id: int, channel: str | None = None) -> bool:
    """SENDING -> SENT when no message is queued or in flight. Safe to call any time, twice."""
    model = _channel(channel or _channel_of(campaign_id))[0]
    busy = model.objects.filter(campaign_id=campaign_id, status__in=model.IN_FLIGHT).exists()
    if busy:
        return False
    with transaction.atomic():
        # A flow step's campaign sends for as long as its flow lives.
        done = (
            Campaign.objects.filter(pk=campaign_id, status=Status.SENDING)
            .exclude(kind=Kind.FLOW)
            .update(status=Status.SENT, finished_at=timezone.now())
        )
        if done:  # held out in a batch that had nothing to send: their window starts now
            lift.held_out_stamp(model=model, campaign_id=campaign_id, batch=None)
    return bool(done)


def _cancel_queued(campaign_id: int) -> int:
    return sum(
        model.objects.filter(campaign_id=campaign_id, status=MsgStatus.QUEUED).update(
            status=MsgStatus.CANCELLED
        )
        for model in (WhatsappMessage, EmailMessage)
    )


def campaign_cancel(*, campaign: Campaign) -> int:
    """Cancel a campaign: its queued messages are never sent. Returns how many were cancelled."""
    with transaction.atomic():
        updated = Campaign.objects.filter(
            pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED, Status.SENDING, Status.PAUSED]
        ).update(status=Status.CANCELLED, finished_at=timezone.now())
        if not updated:
            campaign.refresh_from_db()
            raise CampaignError(
                _("campaign %(id)s is %(status)s; it cannot be cancelled")
                % {"id": campaign.pk, "status": campaign.get_status_display()}
            )
        cancelled = _cancel_queued(campaign.pk)
    jobs.delete_job(trigger_job_id(campaign.pk))  # a scheduled start, if any
    campaign.refresh_from_db()
    return cancelled


def campaign_stop(*, campaign_id: int, reason: str) -> None:
    """The campaign itself cannot be sent (a provider refused its template, its number's token
    cannot be read…): stopped with the reason, its queued messages cancelled."""
    with transaction.atomic():
        if Campaign.objects.filter(
            pk=campaign_id, status__in=[Status.SCHEDULED, Status.SENDING, Status.PAUSED]
        ).update(status=Status.STOPPED, stop_reason=reason, finished_at=timezone.now()):
            _cancel_queued(campaign_id)
            logger.warning("campaign %s stopped: %s", campaign_id, reason, extra={"campaign_id": campaign_id})


def campaign_start_or_stop(*, campaign: Campaign) -> Campaign:
    """Start a campaign no one is watching (its schedule, a recurrence): when nobody would receive
    it, it is stopped with the reason instead, never left waiting nor "sent" to nobody."""
    try:
        return campaign_start(campaign=campaign)
    except EmptyAudience as exc:
        Campaign.objects.filter(pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED]).update(
            status=Status.STOPPED, stop_reason=str(exc), finished_at=timezone.now()
        )
        logger.warning("campaign %s not started: %s", campaign.pk, exc, extra={"campaign_id": campaign.pk})
        campaign.refresh_from_db()
        return campaign


def campaign_pause(*, campaign: Campaign) -> None:
    if not Campaign.objects.filter(pk=campaign.pk, status=Status.SENDING).update(status=Status.PAUSED):
        campaign.refresh_from_db()
        raise CampaignError(
            _("campaign %(id)s is %(status)s; only a sending campaign pauses")
            % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
    campaign.refresh_from_db()


def campaign_resume(*, campaign: Campaign) -> None:
    if not Campaign.objects.filter(pk=campaign.pk, status=Status.PAUSED).update(status=Status.SENDING):
        campaign.refresh_from_db()
        raise CampaignError(
            _("campaign %(id)s is %(status)s; only a paused campaign resumes")
            % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
    campaign.refresh_from_db()
    requeue_unfinished_batches(campaign_id=campaign.pk)


def campaign_retry_failed(*, campaign: Campaign) -> int:
    """Queue the failed messages again (fresh attempts) and reopen the campaign. Returns how many."""
    with transaction.atomic():
        if campaign.channel == Channel.EMAIL:
            # Failed ones, soft bounces and policy blocks (the block may be lifted: the address was
            # never in question); hard bounces are suppressed; never an outcome unknown.
            mail = EmailMessage.objects.filter(campaign_id=campaign.pk).exclude(error_reason=OUTCOME_UNKNOWN)
            reset = {"status": MsgStatus.QUEUED, "attempts": 0, "error_reason": "", "failed_at": None}
            failed = mail.filter(status=EmailMessage.Status.FAILED).update(**reset)
            soft = mail.filter(status=EmailMessage.Status.BOUNCED, bounce_type=BounceType.SOFT).update(
                **reset, bounce_type="", bounce_message=""
            )
            # A block the ESP reported came after the send was counted: that count goes with it.
            blocked_after_send = mail.filter(
                status=EmailMessage.Status.BLOCKED, sent_at__isnull=False
            ).update(**reset, bounce_message="", sent_at=None, esp_message_id=None)
            blocked = blocked_after_send + mail.filter(status=EmailMessage.Status.BLOCKED).update(
                **reset, bounce_message=""
            )
            retried = failed + soft + blocked
            if retried:
                CampaignMetric.objects.filter(campaign_id=campaign.pk).update(
                    failed=F("failed") - failed,
                    bounced=F("bounced") - soft,
                    blocked=F("blocked") - blocked,
                    sent=F("sent") - blocked_after_send,
                )
        else:
            # Not the ones Meta may have accepted: an outcome unknown, or a wamid already assigned.
            retried = (
                WhatsappMessage.objects.filter(
                    campaign_id=campaign.pk, status=MsgStatus.FAILED, wamid__isnull=True
                )
                .exclude(error_reason=OUTCOME_UNKNOWN)
                .update(status=MsgStatus.QUEUED, attempts=0, error_code=None, error_reason="", failed_at=None)
            )
            if retried:
                CampaignMetric.objects.filter(campaign_id=campaign.pk).update(failed=F("failed") - retried)
        if retried:
            Campaign.objects.filter(pk=campaign.pk, status__in=[Status.SENT, Status.STOPPED]).update(
                status=Status.SENDING, finished_at=None, stop_reason=""
            )
    if retried:
        requeue_unfinished_batches(campaign_id=campaign.pk)
    campaign.refresh_from_db()
    return retried


def requeue_unfinished_batches(*, campaign_id: int) -> int:
    """Run now the batches that still have queued messages: waiting ones are pulled forward and
    the ones without a live job are enqueued. Returns how many were (re)started."""
    channel, organization_id = Campaign.objects.filter(pk=campaign_id).values_list(
        "channel", "organization_id"
    ).first() or (Channel.WHATSAPP, None)
    model, _, queue, _, _ = _channel(channel)
    specs = _batch_specs(campaign_id, _queued_batches(model, campaign_id), channel, organization_id)
    pulled = promote.promote_now(queue, [s.job_id or "" for s in specs])
    return pulled + recovery.requeue_missing(specs)
