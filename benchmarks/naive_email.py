"""The naive baseline of benchmarks/email_campaign.py: the seed's original way of sending campaign
email, one RQ job per message (run by RQ's default forking worker) that builds the message and
opens a NEW SMTP connection for it (connect, EHLO, MAIL/RCPT/DATA, QUIT); no claim in bulk, no
shared rate limiter, no pooled connection.

The message itself is built exactly as campaigns.email.sending builds it (same template compiled
from MJML, same tracked links, same MIME structure), so only the sending strategy differs. The
compiled template is cached per process, but a forking worker runs every job in a fresh work
horse, so each email compiles it again: what a job per email costs there.
"""

from __future__ import annotations

import smtplib

from django.db.models import F
from django.utils import timezone

from campaigns import links
from campaigns.email import content as email_content
from campaigns.models import CampaignMetric, EmailMessage
from integrations.email.smtp import CONNECT_TIMEOUT
from integrations.models import EmailSettings
from messaging import email_render, email_transport


def send_one(message_id: int) -> None:
    message = EmailMessage.objects.select_related("campaign__organization", "customer").get(pk=message_id)
    if message.status != EmailMessage.Status.QUEUED:
        return
    campaign = message.campaign
    email_settings = EmailSettings.objects.get(organization_id=campaign.organization_id)
    unsubscribe_url = links.link_url("u", message)
    rendered = email_render.render_email(
        email_content.compiled_email(campaign),
        variables=email_content.variables_for(
            message.customer, store_name=campaign.organization.name, unsubscribe_url=unsubscribe_url
        ),
        click_url=links.link_url("r", message),
        open_pixel_url=links.link_url("o", message),
    )
    address = message.customer.email.strip()
    mime = email_transport.build_message(
        email_settings=email_settings,
        to_name=message.customer.name,
        to_address=address,
        rendered=rendered,
        unsubscribe_url=unsubscribe_url,
    )
    # A new connection for this one email; leaving the block sends QUIT.
    with smtplib.SMTP(email_settings.host, email_settings.port, timeout=CONNECT_TIMEOUT) as client:
        client.ehlo()
        if email_settings.username:
            client.login(email_settings.username, email_settings.get_password())
        client.send_message(mime)
    message.status = EmailMessage.Status.SENT
    message.email = address
    message.sent_at = timezone.now()
    message.save(update_fields=["status", "email", "sent_at"])
    CampaignMetric.objects.filter(campaign_id=campaign.pk).update(
        sent=F("sent") + 1, delivered=F("delivered") + 1
    )
