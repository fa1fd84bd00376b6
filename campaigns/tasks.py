"""RQ jobs of campaigns: they take ids, load fresh state and call services."""

from __future__ import annotations

import logging
import time

from campaigns import sending, services
from campaigns.models import Campaign
from crm.checkpoints import checkpoint

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
        campaign = services.campaign_start(campaign=campaign)
    except services.CampaignError as exc:
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
        return services.campaign_fanout(campaign_id=campaign_id)


def whatsapp_send_batch(campaign_id: int, batch: int) -> dict[str, int]:
    """Send one batch; safe to run any number of times (only queued messages are claimed)."""
    return sending.whatsapp_send_batch(campaign_id=campaign_id, batch=batch)


def email_send_batch(campaign_id: int, batch: int) -> dict[str, int]:
    """Send one batch of emails; safe to run any number of times (only queued messages are claimed)."""
    from campaigns import email_sending

    return email_sending.email_send_batch(campaign_id=campaign_id, batch=batch)


def whatsapp_reconcile() -> int:
    """Every 15 minutes: settle messages stuck in flight."""
    return services.reconcile_in_flight()


def chatwoot_mirror(message_ids: list[int]) -> int:
    """Mirror sent messages to Chatwoot; returns how many, and never mirrors one twice."""
    from campaigns import chatwoot  # here, so this addition stays an append to a shared file

    return chatwoot.chatwoot_mirror_batch(message_ids=message_ids)
