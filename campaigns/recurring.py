"""Recurring campaigns: activate, stop, the dispatch pass and one occurrence."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from campaigns.lifecycle import CampaignError, campaign_start_or_stop, campaign_validate
from campaigns.models import (
    CONTENT_COLUMNS,
    Campaign,
)
from campaigns.recurrence import recurrence_error
from crm import locks, queues
from crm.checkpoints import jobrun_enqueue

Status = Campaign.Status
logger = logging.getLogger(__name__)

# --- Recurring campaigns ---------------------------------------------------------------------------

RECURRING_LOCK_TTL = 300  # the seed's SET NX EX 300 around a dispatch pass
# An occurrence is "missed" when the dispatch finds it later than this (the pass runs every 5
# minutes, so a live system is never this late); the campaign's misfire policy then applies.
MISFIRE_GRACE = timedelta(minutes=10)
_COPIED_FIELDS = ("organization_id", *CONTENT_COLUMNS)


def _occurrences(campaign: Campaign, *, after: datetime, until: datetime) -> list[datetime]:
    """The cron's occurrences in (after, until], computed in the organization's time zone."""
    zone = ZoneInfo(campaign.organization.timezone)
    it = croniter(campaign.recurrence, after.astimezone(zone))
    found: list[datetime] = []
    while True:
        nxt = it.get_next(datetime)
        if nxt > until:
            return found
        found.append(nxt)
        if len(found) > 10_000:  # "* * * * *" down for a week: only the last one matters anyway
            found = found[-1:]


def occurrence_key(campaign_id: int, at: datetime) -> str:
    return f"{campaign_id}@{at.astimezone(UTC):%Y%m%dT%H%MZ}"


def campaign_recurrence_activate(*, campaign: Campaign) -> Campaign:
    """Make a draft campaign recurring: its next cron occurrences each send a copy of it."""
    problem = recurrence_error(campaign.recurrence)
    if problem:
        raise CampaignError(problem)
    campaign_validate(campaign=campaign)
    if not Campaign.objects.filter(pk=campaign.pk, status=Status.DRAFT).update(
        status=Status.RECURRING, recurrence_until=timezone.now()
    ):
        campaign.refresh_from_db()
        raise CampaignError(
            _("campaign %(id)s is %(status)s; only a draft becomes recurring")
            % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
    campaign.refresh_from_db()
    return campaign


def campaign_recurrence_stop(*, campaign: Campaign) -> None:
    """No further occurrences (the ones already sending go on); back to draft."""
    if not Campaign.objects.filter(pk=campaign.pk, status=Status.RECURRING).update(status=Status.DRAFT):
        campaign.refresh_from_db()
        raise CampaignError(
            _("campaign %(id)s is %(status)s, not recurring")
            % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
    campaign.refresh_from_db()


def recurring_dispatch(*, now: datetime | None = None) -> int:
    """Every 5 minutes: record and enqueue each recurring campaign's due occurrence, exactly once.

    Under a distributed lock (SET NX EX 300), so two schedulers never dispatch together; and each
    occurrence is a JobRun with a deterministic key written in the same transaction that moves the
    campaign's watermark, so even without the lock an occurrence is recorded once. Occurrences
    missed while everything was down collapse into the latest one, which is sent once — or
    skipped, by the campaign's misfire policy. Returns how many occurrences were dispatched."""
    now = now or timezone.now()
    dispatched = 0
    with locks.locked("campaigns:recurring-dispatch", ttl=RECURRING_LOCK_TTL) as got:
        if not got:
            logger.info("recurring dispatch: another scheduler holds the lock")
            return 0
        for campaign in Campaign.objects.filter(status=Status.RECURRING).select_related("organization"):
            since = campaign.recurrence_until or campaign.created_at
            due = _occurrences(campaign, after=since, until=now)
            if not due:
                continue
            latest = due[-1]
            skip = campaign.recurrence_misfire == Campaign.Misfire.SKIP and now - latest > MISFIRE_GRACE
            with transaction.atomic():
                # Compare-and-set on the watermark: a concurrent pass (lock expired) moves it once.
                if not Campaign.objects.filter(
                    pk=campaign.pk, status=Status.RECURRING, recurrence_until=campaign.recurrence_until
                ).update(recurrence_until=latest):
                    continue
                if skip:
                    logger.warning(
                        "recurring campaign %s: occurrence %s missed while down; skipped by its policy",
                        campaign.pk,
                        latest.isoformat(),
                        extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
                    )
                    continue
                jobrun_enqueue(
                    kind="campaign-occurrence",
                    key=occurrence_key(campaign.pk, latest),
                    func="campaigns.tasks.campaign_occurrence",
                    queue=queues.CAMPAIGN_TRIGGER,
                    kwargs={"campaign_id": campaign.pk, "occurrence": latest.isoformat()},
                    organization_id=campaign.organization_id,
                )
                dispatched += 1
                if len(due) > 1:
                    logger.warning(
                        "recurring campaign %s: %s occurrences missed; sending the latest (%s) once",
                        campaign.pk,
                        len(due) - 1,
                        latest.isoformat(),
                        extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
                    )
    return dispatched


def campaign_occurrence(*, campaign_id: int, occurrence: datetime) -> Campaign | None:
    """Create the occurrence's campaign (a copy of the recurring one) and start it; idempotent:
    the occurrence is unique per recurring campaign, and an existing one is started only once."""
    template = Campaign.objects.filter(pk=campaign_id).first()
    if template is None:
        return None
    label = timezone.localtime(occurrence).strftime("%Y-%m-%d %H:%M")
    with transaction.atomic():
        child, _ = Campaign.objects.get_or_create(
            parent_id=template.pk,
            occurrence_at=occurrence,
            defaults={
                **{name: getattr(template, name) for name in _COPIED_FIELDS},
                "name": f"{template.name} — {label}"[:200],
            },
        )
        if child.status != Status.DRAFT:
            return child  # started before (a re-run of the job)
        return campaign_start_or_stop(campaign=child)
