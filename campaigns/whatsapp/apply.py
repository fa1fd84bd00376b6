"""A `BatchPlan` written in one transaction of bulk statements, then the Chatwoot mirror."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from campaigns import chatwoot, lifecycle
from campaigns.models import Campaign, CampaignMetric, WhatsappMessage
from campaigns.whatsapp.plan import BatchPlan
from crm import bulk
from crm.models import OptOutSource
from crm.services import customers_opt_out, organizations_pause
from integrations.services import whatsapp_numbers_pause, whatsapp_price_currency

Status = WhatsappMessage.Status
logger = logging.getLogger(__name__)

# --- Apply the plan ------------------------------------------------------------------------------


def batch_apply(
    campaign: Campaign,
    plan: BatchPlan,
    messages: list[WhatsappMessage],
    *,
    currency: str | None = None,
    mirrors: bool | None = None,
) -> BatchPlan:
    """Write the plan over `messages` (the batch's claimed ones still held) in one transaction of
    bulk statements, the rows locked and only those still SENDING written (`BatchPlan.reconciled`),
    the campaign's metrics with F(), the customers' opt-outs, the pauses and the sent messages'
    copies for Chatwoot; then stop a campaign whose template is broken. Returns the plan as written.
    `currency`: the campaign's cost currency, and `mirrors`: whether its organization mirrors to
    Chatwoot, when the caller read them already (a job's chunks: a savepoint and a query less each)."""
    with transaction.atomic():
        rows = (
            WhatsappMessage.objects.select_for_update()
            .filter(id__in=[m.pk for m in messages])
            .values_list("id", "status", "cost")
        )
        current: dict[int, str] = {}
        priced: set[int] = set()
        for pk, status, cost in rows:
            current[pk] = status
            if cost:
                priced.add(pk)
        plan = plan.reconciled(current, priced)
        _write_messages(plan, {m.pk: m for m in messages}, currency or _cost_currency(campaign))
        if plan.retry:
            WhatsappMessage.objects.filter(id__in=plan.retry).update(status=Status.QUEUED, sending_at=None)
        _release(plan.release)
        CampaignMetric.objects.filter(campaign_id=campaign.pk).update(
            sent=F("sent") + len(plan.sent),
            failed=F("failed") + len(plan.failed),
            unknown=F("unknown") + len(plan.unknown),
            skipped=F("skipped") + len(plan.skipped),
            cost=F("cost") + plan.cost,
        )
        _write_sending_state(campaign, plan)
        if plan.sent and mirrors is not False:
            _mirror_to_chatwoot(campaign, list(plan.sent))
    if plan.stop_campaign:
        lifecycle.campaign_stop(campaign_id=campaign.pk, reason=plan.stop_campaign)
    return plan


def _write_messages(plan: BatchPlan, by_id: dict[int, WhatsappMessage], currency: str) -> None:
    """The plan's messages in a few bulk statements, each writing the phone's E.164 form too, and a
    cost with its currency."""
    now = timezone.now()
    sending = {"status": Status.SENDING}
    settled = plan.settled.items()
    _update(by_id, {pk: {"wa_id": a.wa_id} for pk, a in settled if a.cost is None})
    _update(
        by_id,
        {
            pk: {"wa_id": a.wa_id, "cost": a.cost, "cost_currency": currency}
            for pk, a in settled
            if a.cost is not None
        },
    )
    sent = {
        pk: {
            "status": Status.SENT,
            "wamid": a.wamid,
            "wa_id": a.wa_id,
            "sent_at": now,
            "cost": a.cost,
            "cost_currency": currency if a.cost is not None else "",
        }
        for pk, a in plan.sent.items()
    }
    _update(by_id, sent, only_if=sending)
    failed = {
        pk: {"status": Status.FAILED, "error_code": r.code, "error_reason": r.reason, "failed_at": now}
        for pk, r in plan.failed.items()
    }
    _update(by_id, failed, only_if=sending)
    skipped = {pk: {"status": Status.SKIPPED, "error_reason": reason} for pk, reason in plan.skipped.items()}
    _update(by_id, skipped, only_if=sending)
    unknown = {pk: {"status": Status.UNKNOWN, "error_reason": reason} for pk, reason in plan.unknown.items()}
    _update(by_id, unknown, only_if=sending)


def _update(
    by_id: dict[int, WhatsappMessage],
    changes: dict[int, dict[str, Any]],
    *,
    only_if: dict[str, Any] | None = None,
) -> None:
    """Set `changes` (the same fields for every message) on the messages and write them with the phone."""
    if not changes:
        return
    for pk, values in changes.items():
        for name, value in values.items():
            setattr(by_id[pk], name, value)
    fields = [*next(iter(changes.values())), "phone"]
    bulk.update_rows(WhatsappMessage, [by_id[pk] for pk in changes], fields, only_if=only_if)


def _write_sending_state(campaign: Campaign, plan: BatchPlan) -> None:
    """The customers who stopped marketing opted out; the organization or its numbers Meta refused
    paused (crm.services, integrations.services)."""
    if plan.opt_out:
        customers_opt_out(customer_ids=plan.opt_out, channel="whatsapp", source=OptOutSource.PROVIDER)
    if plan.pause_organization:
        organizations_pause(
            organization_ids=[campaign.organization_id], channel="whatsapp", reason=plan.pause_organization
        )
    for number_id, reason in plan.pause_numbers.items():
        whatsapp_numbers_pause(
            organization_id=campaign.organization_id, number_ids=[number_id], reason=reason
        )


def _mirror_to_chatwoot(campaign: Campaign, message_ids: list[int]) -> None:
    """The sent messages' copies for Chatwoot, in the batch's transaction (so a worker killed after
    the commit loses no mirror) but in a savepoint of their own: nothing in making them (a bug) may
    fail a batch whose sends are recorded, so any error is logged and dropped. Their push is
    enqueued after the commit."""
    try:
        with transaction.atomic():
            chatwoot.chatwoot_enqueue_mirror(campaign_id=campaign.pk, message_ids=message_ids)
    except Exception:
        logger.exception(
            "campaign %s: Chatwoot mirror not enqueued",
            campaign.pk,
            extra={"campaign_id": campaign.pk, "organization_id": campaign.organization_id},
        )


def _release(ids: list[int]) -> None:
    """Claimed messages that were not handed to Meta go back to QUEUED, their attempt not spent."""
    if ids:
        WhatsappMessage.objects.filter(id__in=ids, status=Status.SENDING).update(
            status=Status.QUEUED, sending_at=None, attempts=F("attempts") - 1
        )


def _cost_currency(campaign: Campaign) -> str:
    metric = CampaignMetric.objects.filter(campaign_id=campaign.pk).values_list("cost_currency", flat=True)
    return metric.first() or whatsapp_price_currency()
