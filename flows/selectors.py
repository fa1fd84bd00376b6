"""Reads of the flows app: a flow's figures (its status), per step."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import Count, Q, Sum

from campaigns import lift
from campaigns.models import Campaign, CampaignMetric, CampaignRevenue, Channel, SaleAttribution
from flows.models import Enrollment, EnrollmentStep, Flow, StepCampaign


def _per_step_campaigns(flow: Flow) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for index, campaign_id in StepCampaign.objects.filter(flow=flow).values_list("index", "campaign_id"):
        out.setdefault(index, []).append(campaign_id)
    return out


def flow_status(*, flow: Flow) -> dict[str, Any]:
    """entered, active, completed, exited, sent, failed, revenue (a decimal string: sales
    attributed last-touch to its messages) and steps [{index, type, done, sent, revenue}]."""
    counts = Enrollment.objects.filter(flow=flow).aggregate(
        entered=Count("pk"),
        active=Count("pk", filter=Q(status=Enrollment.Status.ACTIVE)),
        completed=Count("pk", filter=Q(status=Enrollment.Status.COMPLETED)),
        exited=Count("pk", filter=Q(status=Enrollment.Status.EXITED)),
    )
    done = dict(
        EnrollmentStep.objects.filter(flow=flow)
        .exclude(outcome=EnrollmentStep.Outcome.PENDING)
        .values_list("index")
        .annotate(n=Count("pk"))
        .order_by()
    )
    campaigns = _per_step_campaigns(flow)
    sent: dict[int, dict[str, int]] = {}
    revenue: dict[int, Decimal] = {}
    for index, ids in campaigns.items():
        sent[index] = CampaignMetric.objects.filter(campaign_id__in=ids).aggregate(
            sent=Sum("sent"), failed=Sum("failed")
        )
        revenue[index] = CampaignRevenue.objects.filter(campaign_id__in=ids).aggregate(r=Sum("revenue"))[
            "r"
        ] or Decimal("0")
    steps = [
        {
            "index": i,
            "type": step["type"],
            "done": done.get(i, 0),
            "sent": (sent.get(i) or {}).get("sent") or 0,
            "revenue": str(revenue.get(i, Decimal("0.00"))),
        }
        for i, step in enumerate(flow.steps)
    ]
    return {
        "entered": counts["entered"],
        "active": counts["active"],
        "completed": counts["completed"],
        "exited": counts["exited"],
        "sent": sum((v.get("sent") or 0) for v in sent.values()),
        "failed": sum((v.get("failed") or 0) for v in sent.values()),
        "revenue": str(sum(revenue.values(), Decimal("0.00"))),
        "steps": steps,
    }


def flow_lift(*, flow: Flow) -> dict[str, Any] | None:
    """The flow's lift report (`flows status --json` key "lift", the campaigns' shape): its step
    campaigns with a control arm (a split's holdout branch) pooled as one experiment, each customer
    and sale once per arm; None without a holdout branch."""
    campaigns = list(
        Campaign.objects.filter(flow_step__flow=flow, control_percent__gt=0)
        .select_related("organization")
        .order_by("pk")
    )
    if campaigns:
        return lift.campaigns_lift(campaigns=campaigns)
    if not flow.control_percent:
        return None
    nobody = lift.ArmFigures(0, 0, Decimal("0"), Decimal("0"))
    days = lift.window_days(organization=flow.organization, channel=Channel.WHATSAPP)
    return lift.lift_report(treatment=nobody, control=nobody, window_days=days)


def flow_attributed_buyers(*, flow: Flow) -> int:
    """Distinct customers with a sale attributed (last touch) to one of the flow's messages."""
    return (
        SaleAttribution.objects.filter(campaign__flow_step__flow=flow, sale__customer__isnull=False)
        .values("sale__customer_id")
        .distinct()
        .count()
    )
