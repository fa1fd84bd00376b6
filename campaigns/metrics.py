"""The campaigns' families on /metrics (registered with crm.prometheus by CampaignsConfig.ready)."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Sum
from prometheus_client.core import GaugeMetricFamily, Metric
from redis import Redis

from campaigns.models import CampaignMetric

MESSAGE_STATUSES = (
    "sent",
    "delivered",
    "read",
    "failed",
    "skipped",
    "opened",
    "clicked",
    "bounced",
    "blocked",
    "unknown",
)


def collect_messages(connection: Redis) -> Iterator[Metric]:
    """`crm_messages`: campaign messages by channel and status, one GROUP BY over the campaigns'
    counters (one row per campaign, not per message)."""
    rows = (
        CampaignMetric.objects.order_by()
        .values("campaign__channel")
        .annotate(**{status: Sum(status) for status in MESSAGE_STATUSES})
    )
    # A gauge, not a counter: a retry of failed messages lowers failed and deleting a campaign
    # lowers them all, which a counter must never do (Prometheus would read a reset).
    family = GaugeMetricFamily(
        "crm_messages",
        "Campaign messages by channel and status now: the sum of the campaigns' counters.",
        labels=["channel", "status"],
    )
    for row in rows:
        for status in MESSAGE_STATUSES:
            family.add_metric([row["campaign__channel"], status], row[status] or 0)
    yield family
