"""A flow's send steps in the campaigns' pipeline: each send step's campaign (one per flow
version, step and round: its one-message-per-customer constraint is the step's exactly-once
send) and the send of a job's messages through the campaigns' send batch."""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from campaigns import lifecycle
from campaigns.email.sending import email_send_batch
from campaigns.models import Campaign, CampaignMetric, Channel, Kind
from campaigns.whatsapp.sending import whatsapp_send_batch
from crm import jobs, queues
from flows.models import Flow, StepCampaign
from integrations.models import WhatsappNumber

logger = logging.getLogger(__name__)

# The step campaigns the running job has looked up (a step's campaign never changes).
CAMPAIGNS: ContextVar[dict[tuple[int, int, int, int], Campaign] | None] = ContextVar(
    "flows_campaigns", default=None
)
SEND_FUNCS = {
    Channel.WHATSAPP: "campaigns.tasks.whatsapp_send_batch",
    Channel.EMAIL: "campaigns.tasks.email_send_batch",
}


def send_now(channel: Channel, campaign_id: int, batch: int, organization_id: int) -> None:
    """The step's message through the campaigns' send batch, in this job (no second hop): the
    batch claims it before calling the provider. What must wait (pacing, a pause: Defer) or
    failed here goes to the channel's send queue, where its retries and give-up apply; a crash
    before this leaves it queued for the `whatsapp-batches`/`email-batches` recoverer."""
    func = email_send_batch if channel == Channel.EMAIL else whatsapp_send_batch
    try:
        func(campaign_id=campaign_id, batch=batch)
    except Exception as exc:  # the job's edge for this send: handed to the queue that retries it
        delay = exc.seconds if isinstance(exc, jobs.Defer) else 1.0
        if not isinstance(exc, jobs.Defer):
            logger.warning("flow send of campaign %s batch %s failed (%s); queued", campaign_id, batch, exc)
        jobs.enqueue(
            SEND_FUNCS[channel],
            queue=queues.EMAIL_SEND if channel == Channel.EMAIL else queues.WHATSAPP_SEND,
            kwargs={"campaign_id": campaign_id, "batch": batch},
            job_id=lifecycle.batch_job_id(campaign_id, batch, channel),
            delay=delay,
            organization_id=organization_id,
            after_commit=False,
        )


def _campaign_fields(flow: Flow, step: dict) -> dict[str, Any] | None:
    if step["type"] == "send_email":
        return {
            "channel": Channel.EMAIL,
            "email_subject": step["subject"],
            "email_body": step["body"],
            "email_body_format": step.get("body_format", "mjml"),
        }
    number = WhatsappNumber.objects.filter(organization_id=flow.organization_id).order_by("pk").first()
    if number is None:
        return None
    return {
        "channel": Channel.WHATSAPP,
        "whatsapp_number": number,
        "template_name": step["template"],
        "template_language": step.get("language", "pt_BR"),
        "template_category": step.get("category", "utility" if flow.transactional else "marketing"),
        "template_variables": step.get("variables", []),
        "header_image_url": step.get("header_image_url", ""),
    }


def step_campaign(*, flow: Flow, index: int, round: int, step: dict) -> Campaign | None:
    """The campaign carrying this send step's messages for this round (made once, race-free:
    StepCampaign is unique); None when the organization has no WhatsApp number for it."""
    key = {"flow": flow, "version": flow.version, "index": index, "round": round}
    cache = CAMPAIGNS.get()
    cached = cache.get((flow.pk, flow.version, index, round)) if cache is not None else None
    if cached is not None:
        return cached
    found = StepCampaign.objects.filter(**key).select_related("campaign").first()
    if found is not None:
        if cache is not None:
            cache[(flow.pk, flow.version, index, round)] = found.campaign
        return found.campaign
    fields = _campaign_fields(flow, step)
    if fields is None:
        return None
    try:
        with transaction.atomic():
            now = timezone.now()
            campaign = Campaign.objects.create(
                organization_id=flow.organization_id,
                name=f"{flow.name} · {index + 1}" + (f" · {round}" if round > 1 else ""),
                status=Campaign.Status.SENDING,
                started_at=now,
                kind=Kind.FLOW,
                caps_exempt=flow.transactional,
                control_percent=flow.control_percent,
                **fields,
            )
            CampaignMetric.objects.create(campaign=campaign)
            StepCampaign.objects.create(campaign=campaign, **key)
    except IntegrityError:
        return StepCampaign.objects.select_related("campaign").get(**key).campaign
    return campaign
