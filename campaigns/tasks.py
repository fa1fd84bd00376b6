"""RQ jobs of campaigns: they take ids, load fresh state and call services."""

from __future__ import annotations

import logging
import time
from datetime import date, datetime

from campaigns import chatwoot, fanout, lifecycle, recovery, recurring, segments
from campaigns.email import sending as email_sending
from campaigns.models import Campaign
from campaigns.recurring import occurrence_key
from campaigns.test_sends import test_send_run
from campaigns.whatsapp import sending
from crm import queues
from crm.checkpoints import AlreadyDone, checkpoint, jobrun_enqueue
from crm.models import JobRun

logger = logging.getLogger(__name__)


def campaign_trigger(campaign_id: int) -> str:
    """Start a scheduled campaign at its time; firing twice is harmless (returns the status)."""
    started = time.monotonic()
    campaign = Campaign.objects.filter(pk=campaign_id).first()
    if campaign is None:
        return "missing"
    logger.info(
        "campaign %s trigger: starting (%s)",
        campaign_id,
        campaign.channel,
        extra={"campaign_id": campaign_id, "organization_id": campaign.organization_id},
    )
    try:
        campaign = lifecycle.campaign_start_or_stop(campaign=campaign)
    except lifecycle.CampaignError as exc:
        logger.info(
            "campaign %s trigger: not started: %s", campaign_id, exc, extra={"campaign_id": campaign_id}
        )
        return campaign.status
    logger.info(
        "campaign %s trigger: started in %.3fs",
        campaign_id,
        time.monotonic() - started,
        extra={"campaign_id": campaign_id, "organization_id": campaign.organization_id},
    )
    return campaign.status


def campaign_fanout(campaign_id: int) -> int:
    """Materialize the campaign's messages and enqueue its send batches; returns recipients."""
    with checkpoint(kind="campaign-fanout", key=str(campaign_id)):
        return fanout.campaign_fanout(campaign_id=campaign_id)


def whatsapp_send_batch(campaign_id: int, batch: int) -> dict[str, int]:
    """Send one batch; safe to run any number of times (only queued messages are claimed)."""
    return sending.whatsapp_send_batch(campaign_id=campaign_id, batch=batch)


def email_send_batch(campaign_id: int, batch: int) -> dict[str, int]:
    """Send one batch of emails; safe to run any number of times (only queued messages are claimed)."""
    return email_sending.email_send_batch(campaign_id=campaign_id, batch=batch)


def whatsapp_reconcile() -> int:
    """Every 15 minutes: settle messages stuck in flight."""
    return recovery.reconcile_in_flight()


def chatwoot_mirror(message_ids: list[int]) -> int:
    """A mirror job enqueued before mirrors went through the conversations: the messages' copies
    made (once) and pushed; returns how many."""
    return chatwoot.chatwoot_mirror_batch(message_ids=message_ids)


def recurring_dispatch() -> int:
    """Every 5 minutes: dispatch each recurring campaign's due occurrence once."""
    return recurring.recurring_dispatch()


def campaign_occurrence(campaign_id: int, occurrence: str) -> int | None:
    """Create and start one occurrence of a recurring campaign; returns its campaign id."""
    at = datetime.fromisoformat(occurrence)
    started = time.monotonic()
    try:
        with checkpoint(kind="campaign-occurrence", key=occurrence_key(campaign_id, at)):
            child = recurring.campaign_occurrence(campaign_id=campaign_id, occurrence=at)
    except AlreadyDone:
        return None
    logger.info(
        "recurring campaign %s: occurrence %s started as campaign %s in %.3fs",
        campaign_id,
        occurrence,
        child.pk if child else None,
        time.monotonic() - started,
        extra={"campaign_id": campaign_id},
    )
    return child.pk if child else None


SEGMENTS_KIND = "segments-snapshot"


def segments_snapshot_all() -> int:
    """Daily: record and enqueue one snapshot run per organization with sales, for its last complete
    day in its own time zone; returns how many were enqueued (a day already computed is skipped)."""
    enqueued = 0
    for org_id, tz in segments.organizations_with_sales().values_list("pk", "timezone"):
        enqueued += segments_snapshot_enqueue(organization_id=org_id, day=segments.default_day(tz))
    return enqueued


def segments_snapshot_enqueue(*, organization_id: int, day: date) -> bool:
    """Record and enqueue one organization's snapshot of `day`; False when that day is done already
    (the daily schedule and the segments page's button: one checkpoint per organization and day)."""
    run = jobrun_enqueue(
        kind=SEGMENTS_KIND,
        key=f"{organization_id}:{day.isoformat()}",
        func=segments_snapshot_organization,
        queue=queues.ERP_SYNC,
        kwargs={"organization_id": organization_id, "day": day.isoformat()},
        organization_id=organization_id,
    )
    return run.status != JobRun.Status.COMPLETED


def segments_snapshot_organization(organization_id: int, day: str) -> dict[str, int]:
    """One organization's snapshot of `day` (ISO date), then pruning to SEGMENT_KEEP_DAYS; returns
    customers per segment. Under a checkpoint: a completed day is not computed again ({})."""
    started = time.monotonic()
    try:
        with checkpoint(
            kind=SEGMENTS_KIND,
            key=f"{organization_id}:{day}",
            func=segments_snapshot_organization,
            queue=queues.ERP_SYNC,
            kwargs={"organization_id": organization_id, "day": day},
            organization_id=organization_id,
        ):
            counts = segments.segments_snapshot(organization_id=organization_id, day=date.fromisoformat(day))
            pruned = segments.segments_prune(organization_id=organization_id)
    except AlreadyDone:
        return {}
    logger.info(
        "segments of organization %s on %s: %s customers in %.1fs (%s old rows pruned)",
        organization_id,
        day,
        sum(counts.values()),
        time.monotonic() - started,
        pruned,
        extra={"organization_id": organization_id},
    )
    return counts


def test_send(test_send_id: int) -> str:
    """Send one manager's test of a campaign (campaigns.test_sends); a re-run sends nothing."""
    return test_send_run(test_send_id=test_send_id)
