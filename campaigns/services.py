"""Every write on campaigns: start, fan-out, cancel, pause, resume, retry, completion."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F
from django.utils import timezone

from campaigns import selectors
from campaigns.models import OUTCOME_UNKNOWN, Campaign, CampaignMetric, WhatsappMessage
from crm import jobs, promote, queues, recovery
from crm.checkpoints import jobrun_enqueue

logger = logging.getLogger(__name__)

Status = Campaign.Status
MsgStatus = WhatsappMessage.Status


class CampaignError(ValueError):
    """An operator action that does not apply to the campaign as it is."""


def _batch_size() -> int:
    return int(settings.WHATSAPP_BATCH_SIZE)


def batch_job_id(campaign_id: int, batch: int) -> str:
    return jobs.make_job_id("wa", campaign_id, batch)


def campaign_validate(*, campaign: Campaign) -> None:
    """Raise CampaignError when the campaign cannot be sent as configured."""
    if campaign.channel != "whatsapp":
        raise CampaignError(f"{campaign.channel} campaigns are not supported yet")
    if campaign.whatsapp_number_id is None:
        raise CampaignError("choose the WhatsApp number to send from")
    if not campaign.template_name:
        raise CampaignError("the template name is required")
    from campaigns.models import VARIABLE_SOURCES

    unknown = [v for v in campaign.template_variables if v not in VARIABLE_SOURCES]
    if unknown:
        raise CampaignError(
            f"unknown template variable source(s): {', '.join(map(str, unknown))}; "
            f"use {', '.join(VARIABLE_SOURCES)}"
        )
    if campaign.redirect_button_index is not None and not campaign.redirect_url:
        raise CampaignError("a redirect button needs a redirect URL")


def campaign_start(*, campaign: Campaign) -> Campaign:
    """Move a draft or scheduled campaign to sending and enqueue its fan-out; returns at once."""
    campaign_validate(campaign=campaign)
    with transaction.atomic():
        now = timezone.now()
        updated = Campaign.objects.filter(pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED]).update(
            status=Status.SENDING, started_at=now, finished_at=None, stop_reason=""
        )
        if not updated:
            campaign.refresh_from_db()
            raise CampaignError(
                f"campaign {campaign.pk} is {campaign.status}; only a draft or scheduled campaign can start"
            )
        CampaignMetric.objects.get_or_create(campaign=campaign)
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
        raise CampaignError("the schedule needs a time zone")
    if at <= timezone.now():
        raise CampaignError("the scheduled time is in the past; start it now instead")
    campaign_validate(campaign=campaign)
    with transaction.atomic():
        if not Campaign.objects.filter(pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED]).update(
            status=Status.SCHEDULED, scheduled_at=at
        ):
            campaign.refresh_from_db()
            raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; only a draft can be scheduled")
        jobs.enqueue(
            "campaigns.tasks.campaign_trigger",
            queue=queues.CAMPAIGN_TRIGGER,
            kwargs={"campaign_id": campaign.pk},
            job_id=trigger_job_id(campaign.pk),
            replace=True,
            at=at,
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


@recovery.register("campaign-triggers")
def _scheduled_starts() -> Iterator[jobs.JobSpec]:
    """Scheduled campaigns whose delayed start Redis no longer holds (due ones start at once)."""
    for pk, at in Campaign.objects.filter(status=Status.SCHEDULED).values_list("pk", "scheduled_at"):
        yield jobs.JobSpec(
            func="campaigns.tasks.campaign_trigger",
            queue=queues.CAMPAIGN_TRIGGER,
            kwargs={"campaign_id": pk},
            job_id=trigger_job_id(pk),
            at=at if at and at > timezone.now() else None,
        )


def _batch_specs(campaign_id: int, batches: list[int]) -> list[jobs.JobSpec]:
    return [
        jobs.JobSpec(
            func="campaigns.tasks.whatsapp_send_batch",
            queue=queues.WHATSAPP_SEND,
            kwargs={"campaign_id": campaign_id, "batch": b},
            job_id=batch_job_id(campaign_id, b),
        )
        for b in batches
    ]


def campaign_fanout(*, campaign_id: int, chunk: int = 5000) -> int:
    """Create one message per recipient (bulk, idempotent) and enqueue one send job per batch.

    Safe to run again after a crash: existing messages keep their batch, and only batches whose
    job is not alive in Redis are enqueued. Returns the number of recipients.
    """
    campaign = Campaign.objects.get(pk=campaign_id)
    if campaign.status not in (Status.SENDING, Status.PAUSED):
        return 0
    size = _batch_size()
    audience = selectors.campaign_audience(campaign=campaign).order_by("pk").values_list("pk", flat=True)
    rows: list[WhatsappMessage] = []
    for position, customer_id in enumerate(audience.iterator(chunk_size=chunk)):
        rows.append(
            WhatsappMessage(
                campaign_id=campaign.pk,
                organization_id=campaign.organization_id,
                customer_id=customer_id,
                batch=position // size,
            )
        )
        if len(rows) >= chunk:
            WhatsappMessage.objects.bulk_create(rows, ignore_conflicts=True)
            rows = []
    if rows:
        WhatsappMessage.objects.bulk_create(rows, ignore_conflicts=True)
    total = WhatsappMessage.objects.filter(campaign_id=campaign.pk).count()
    if total >= 10_000 and connection.vendor == "postgresql":
        # Tens of thousands of fresh rows: refresh the planner's statistics now, or until
        # autovacuum gets to it the send batches' limit checks pick plans 200x slower.
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {WhatsappMessage._meta.db_table}")
    CampaignMetric.objects.filter(campaign_id=campaign.pk).update(queued=total)
    batches = list(
        WhatsappMessage.objects.filter(campaign_id=campaign.pk, status=MsgStatus.QUEUED)
        .order_by("batch")
        .values_list("batch", flat=True)
        .distinct()
    )
    recovery.requeue_missing(_batch_specs(campaign.pk, batches))
    logger.info(
        "campaign %s fanned out: %s recipients in %s batches",
        campaign.pk,
        total,
        len(batches),
        extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
    )
    if not batches:
        campaign_complete_if_done(campaign_id=campaign.pk)
    return total


def campaign_complete_if_done(*, campaign_id: int) -> bool:
    """SENDING -> SENT when no message is queued or in flight. Safe to call any time, twice."""
    busy = WhatsappMessage.objects.filter(
        campaign_id=campaign_id, status__in=WhatsappMessage.IN_FLIGHT
    ).exists()
    if busy:
        return False
    return bool(
        Campaign.objects.filter(pk=campaign_id, status=Status.SENDING).update(
            status=Status.SENT, finished_at=timezone.now()
        )
    )


def _cancel_queued(campaign_id: int) -> int:
    return WhatsappMessage.objects.filter(campaign_id=campaign_id, status=MsgStatus.QUEUED).update(
        status=MsgStatus.CANCELLED
    )


def campaign_cancel(*, campaign: Campaign) -> int:
    """Cancel a campaign: its queued messages are never sent. Returns how many were cancelled."""
    with transaction.atomic():
        updated = Campaign.objects.filter(
            pk=campaign.pk, status__in=[Status.DRAFT, Status.SCHEDULED, Status.SENDING, Status.PAUSED]
        ).update(status=Status.CANCELLED, finished_at=timezone.now())
        if not updated:
            campaign.refresh_from_db()
            raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; it cannot be cancelled")
        cancelled = _cancel_queued(campaign.pk)
    jobs.delete_job(trigger_job_id(campaign.pk))  # a scheduled start, if any
    campaign.refresh_from_db()
    return cancelled


def campaign_stop(*, campaign_id: int, reason: str) -> None:
    """A provider said the campaign itself cannot be sent (e.g. its template is broken)."""
    with transaction.atomic():
        if Campaign.objects.filter(pk=campaign_id, status__in=[Status.SENDING, Status.PAUSED]).update(
            status=Status.STOPPED, stop_reason=reason, finished_at=timezone.now()
        ):
            _cancel_queued(campaign_id)
            logger.warning("campaign %s stopped: %s", campaign_id, reason, extra={"campaign_id": campaign_id})


def campaign_pause(*, campaign: Campaign) -> None:
    if not Campaign.objects.filter(pk=campaign.pk, status=Status.SENDING).update(status=Status.PAUSED):
        campaign.refresh_from_db()
        raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; only a sending campaign pauses")
    campaign.refresh_from_db()


def campaign_resume(*, campaign: Campaign) -> None:
    if not Campaign.objects.filter(pk=campaign.pk, status=Status.PAUSED).update(status=Status.SENDING):
        campaign.refresh_from_db()
        raise CampaignError(f"campaign {campaign.pk} is {campaign.status}; only a paused campaign resumes")
    campaign.refresh_from_db()
    requeue_unfinished_batches(campaign_id=campaign.pk)


def campaign_retry_failed(*, campaign: Campaign) -> int:
    """Queue the failed messages again (fresh attempts) and reopen the campaign. Returns how many."""
    with transaction.atomic():
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
    batches = list(
        WhatsappMessage.objects.filter(campaign_id=campaign_id, status=MsgStatus.QUEUED)
        .order_by("batch")
        .values_list("batch", flat=True)
        .distinct()
    )
    specs = _batch_specs(campaign_id, batches)
    pulled = promote.promote_now(queues.WHATSAPP_SEND, [s.job_id or "" for s in specs])
    return pulled + recovery.requeue_missing(specs)


@recovery.register("whatsapp-batches")
def _unfinished_batches() -> Iterator[jobs.JobSpec]:
    """Every batch of a sending campaign that still has queued messages."""
    pairs = (
        WhatsappMessage.objects.filter(
            status=MsgStatus.QUEUED, campaign__status__in=[Status.SENDING, Status.PAUSED]
        )
        .order_by("campaign_id", "batch")
        .values_list("campaign_id", "batch")
        .distinct()
    )
    for campaign_id, batch in pairs.iterator(chunk_size=2000):
        yield from _batch_specs(campaign_id, [batch])


def reconcile_in_flight(*, older_than_seconds: int | None = None) -> int:
    """Settle messages stuck in SENDING (their worker died after claiming them).

    Their outcome is unknown (Meta may have accepted them): they are FAILED with that reason and
    never sent again, because a second send is worse than a missing one. A status webhook that
    arrives later still moves them to sent/delivered/read. Returns how many were settled.
    """
    limit = older_than_seconds if older_than_seconds is not None else settings.WHATSAPP_IN_FLIGHT_TIMEOUT
    cutoff = timezone.now() - timedelta(seconds=limit)
    stuck = WhatsappMessage.objects.filter(status=MsgStatus.SENDING, sending_at__lt=cutoff)
    per_campaign: dict[int, int] = {}
    for campaign_id, n in stuck.values_list("campaign_id").annotate(n=Count("id")).order_by():
        per_campaign[campaign_id] = n
    settled = 0
    for campaign_id in per_campaign:
        with transaction.atomic():
            n = WhatsappMessage.objects.filter(
                campaign_id=campaign_id, status=MsgStatus.SENDING, sending_at__lt=cutoff
            ).update(
                status=MsgStatus.FAILED,
                failed_at=timezone.now(),
                error_reason=OUTCOME_UNKNOWN,
            )
            CampaignMetric.objects.filter(campaign_id=campaign_id).update(failed=F("failed") + n)
        settled += n
        campaign_complete_if_done(campaign_id=campaign_id)
    return settled
