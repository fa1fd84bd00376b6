"""Campaigns' unfinished work: recoverers, give-ups and the in-flight reconcile (wired in apps.ready)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F
from django.utils import timezone

from campaigns.lifecycle import (
    _batch_specs,
    _channel,
    _queued_batches,
    campaign_complete_if_done,
    campaign_stop,
    trigger_job_id,
)
from campaigns.models import (
    OUTCOME_UNKNOWN,
    Campaign,
    CampaignMetric,
    Channel,
    WhatsappMessage,
)
from crm import jobs, queues
from crm.crypto import DecryptionError

Status = Campaign.Status
MsgStatus = WhatsappMessage.Status


def scheduled_starts() -> Iterator[jobs.JobSpec]:
    """Scheduled campaigns whose delayed start Redis no longer holds (due ones start at once)."""
    scheduled = Campaign.objects.filter(status=Status.SCHEDULED).values_list(
        "pk", "scheduled_at", "organization_id"
    )
    for pk, at, organization_id in scheduled:
        yield jobs.JobSpec(
            func="campaigns.tasks.campaign_trigger",
            queue=queues.CAMPAIGN_TRIGGER,
            kwargs={"campaign_id": pk},
            job_id=trigger_job_id(pk),
            at=at if at and at > timezone.now() else None,
            organization_id=organization_id,
        )


def _unfinished(channel: str) -> Iterator[jobs.JobSpec]:
    # Campaign by campaign: each one's queued batches are a range of one index (no index holds
    # the queued messages of every campaign: the fan-out would write it for each message).
    model = _channel(channel)[0]
    active = (
        Campaign.objects.filter(channel=channel, status__in=[Status.SENDING, Status.PAUSED])
        .order_by("pk")
        .values_list("pk", "organization_id")
    )
    for campaign_id, organization_id in active.iterator(chunk_size=2000):
        yield from _batch_specs(campaign_id, _queued_batches(model, campaign_id), channel, organization_id)


# Errors that say the campaign's own configuration is broken: giving up stops the campaign.
CONFIGURATION_ERRORS: tuple[type[BaseException], ...] = (DecryptionError,)


def batch_give_up(
    *, channel: str, campaign_id: int, batch: int, reason: str, error: BaseException | None
) -> int:
    """A send batch that cannot succeed ends: its queued messages FAILED with the reason (counted,
    the campaign completes), or the campaign stopped when its configuration is the cause.
    Returns the messages failed. Safe to call twice."""
    if isinstance(error, CONFIGURATION_ERRORS):
        campaign_stop(campaign_id=campaign_id, reason=reason)
        return 0
    model = _channel(channel)[0]
    with transaction.atomic():
        failed = model.objects.filter(campaign_id=campaign_id, batch=batch, status=MsgStatus.QUEUED).update(
            status=MsgStatus.FAILED, failed_at=timezone.now(), error_reason=reason
        )
        CampaignMetric.objects.filter(campaign_id=campaign_id).update(failed=F("failed") + failed)
    campaign_complete_if_done(campaign_id=campaign_id, channel=channel)
    return failed


def whatsapp_batch_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    batch_give_up(channel=Channel.WHATSAPP, reason=reason, error=error, **kwargs)


def email_batch_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    batch_give_up(channel=Channel.EMAIL, reason=reason, error=error, **kwargs)


def fanout_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    """A fan-out that cannot succeed stops its campaign (it would stay `sending` with no messages)."""
    campaign_stop(campaign_id=kwargs["campaign_id"], reason=reason)


def trigger_given_up(kwargs: dict, reason: str, error: BaseException | None) -> None:
    campaign_stop(campaign_id=kwargs["campaign_id"], reason=reason)


def whatsapp_batches_unfinished() -> Iterator[jobs.JobSpec]:
    """Every batch of a sending WhatsApp campaign that still has queued messages."""
    return _unfinished(Channel.WHATSAPP)


def email_batches_unfinished() -> Iterator[jobs.JobSpec]:
    """Every batch of a sending email campaign that still has queued messages."""
    return _unfinished(Channel.EMAIL)


def reconcile_in_flight(*, older_than_seconds: int | None = None) -> int:
    """Settle messages stuck in SENDING (their worker died after claiming them).

    Their outcome is unknown (the provider may have accepted them), and they are never sent again,
    because a second send is worse than a missing one. A WhatsApp message becomes UNKNOWN (counted
    in `unknown`, not failed): Meta may still report it, and a late status webhook moves it to
    sent, delivered, read or failed. An email is FAILED with that reason (SMTP reports nothing
    later). Either way the campaign can complete. Returns how many were settled.
    """
    limit = older_than_seconds if older_than_seconds is not None else settings.WHATSAPP_IN_FLIGHT_TIMEOUT
    cutoff = timezone.now() - timedelta(seconds=limit)
    settled = 0
    for channel in (Channel.WHATSAPP, Channel.EMAIL):
        model = _channel(channel)[0]
        settle: dict[str, object]
        if channel == Channel.WHATSAPP:
            settle, counter = {"status": MsgStatus.UNKNOWN}, "unknown"
        else:
            settle, counter = {"status": MsgStatus.FAILED, "failed_at": timezone.now()}, "failed"
        stuck = model.objects.filter(status=MsgStatus.SENDING, sending_at__lt=cutoff)
        campaign_ids = [c for c, _ in stuck.values_list("campaign_id").annotate(n=Count("id")).order_by()]
        for campaign_id in campaign_ids:
            with transaction.atomic():
                n = model.objects.filter(
                    campaign_id=campaign_id, status=MsgStatus.SENDING, sending_at__lt=cutoff
                ).update(**settle, error_reason=OUTCOME_UNKNOWN)
                CampaignMetric.objects.filter(campaign_id=campaign_id).update(**{counter: F(counter) + n})
            settled += n
            campaign_complete_if_done(campaign_id=campaign_id, channel=channel)
    return settled
