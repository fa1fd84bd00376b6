"""RQ jobs of campaigns: they take ids, load fresh state and call services."""

from __future__ import annotations

from campaigns import sending, services
from crm.checkpoints import checkpoint


def campaign_fanout(campaign_id: int) -> int:
    """Materialize the campaign's messages and enqueue its send batches; returns recipients."""
    with checkpoint(kind="campaign-fanout", key=str(campaign_id)):
        return services.campaign_fanout(campaign_id=campaign_id)


def whatsapp_send_batch(campaign_id: int, batch: int) -> dict[str, int]:
    """Send one batch; safe to run any number of times (only queued messages are claimed)."""
    return sending.whatsapp_send_batch(campaign_id=campaign_id, batch=batch)


def whatsapp_reconcile() -> int:
    """Every 15 minutes: settle messages stuck in flight."""
    return services.reconcile_in_flight()
