"""The naive baseline of benchmarks/whatsapp_campaign.py: one RQ job per message, one blocking
HTTP request each, no claim in bulk — what a straight port of the seed's processor would do."""

from __future__ import annotations

import httpx
from django.conf import settings
from django.utils import timezone

from campaigns.models import WhatsappMessage
from integrations.whatsapp.client import TemplateMessage, build_payload


def send_one(message_id: int) -> None:
    message = WhatsappMessage.objects.select_related("campaign__whatsapp_number", "customer").get(
        pk=message_id
    )
    if message.status != WhatsappMessage.Status.QUEUED:
        return
    number = message.campaign.whatsapp_number
    assert number is not None
    payload = build_payload(
        TemplateMessage(
            to=message.customer.phone.lstrip("+"),
            template=message.campaign.template_name,
            language="pt_BR",
            body=[message.customer.name.split(" ")[0]],
        )
    )
    url = f"{number.graph_url}/{settings.WHATSAPP_GRAPH_VERSION}/{number.phone_number_id}/messages"
    response = httpx.post(
        url, json=payload, headers={"Authorization": f"Bearer {number.get_access_token()}"}, timeout=30
    )
    response.raise_for_status()
    message.status = WhatsappMessage.Status.SENT
    message.wamid = response.json()["messages"][0]["id"]
    message.sent_at = timezone.now()
    message.save(update_fields=["status", "wamid", "sent_at"])
