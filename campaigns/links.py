"""Signed links in campaign messages: the redirect (click tracking), the unsubscribe endpoint and,
for emails, the open pixel.

A link carries the message's `token` (unique; campaigns.fanout makes it) signed with SECRET_KEY, so
a made-up or tampered link is rejected by an HMAC check before the database is asked anything, and a
leaked database dump of tokens alone cannot be turned into working links. Each kind signs with its
own salt: the open pixel's token (visible to anyone the email is forwarded to, and fetched by image
proxies) never works as the message's unsubscribe link, nor the other way round.
"""

from __future__ import annotations

import functools
import hashlib
import hmac

from django.conf import settings
from django.core import signing
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from campaigns.email.content import compiled_email
from campaigns.models import Campaign, CampaignMetric, Channel, EmailMessage, WhatsappMessage
from crm import hooks
from crm.models import OptOutSource
from crm.services import SendingChannel, customers_opt_out
from messaging import email_render

KINDS = ("r", "u", "o")  # r: redirect (click tracking), u: unsubscribe, o: open pixel (emails)
# An email message's signed value starts with this ("~" is never in a token or a signature), so
# one lookup finds the message whatever its channel; WhatsApp links carry the bare token.
EMAIL_PREFIX = "e~"

Message = WhatsappMessage | EmailMessage


def _signer(kind: str) -> signing.Signer:
    if kind not in KINDS:
        raise ValueError(f"unknown link kind {kind!r}")
    # "." is URL-safe and never appears in a token (base64url and hex) or in the base64url signature, so
    # the signed value needs no escaping inside the button's URL path ("r/<token>.<signature>", at
    # most 73 characters).
    # Built per call so a rotated SECRET_KEY (or SECRET_KEY_FALLBACKS) is honoured.
    return signing.Signer(salt=f"campaigns.link.{kind}", sep=".")


def link_targets(*, campaign: Campaign) -> dict[str, object]:
    """The campaign's tracked link targets now, to freeze when it starts (Campaign.sent_links): the
    WhatsApp button's redirect URL and, for emails, the body's tracked links in order."""
    targets: list[str] = []
    if campaign.channel == Channel.EMAIL:
        try:
            targets = list(
                email_render.compile_email(
                    subject=campaign.email_subject,
                    body=campaign.email_body,
                    body_format=campaign.email_body_format,
                ).links
            )
        except email_render.TemplateError:
            targets = []  # campaign_validate refused it already; nothing is sent, no link exists
    return {"redirect_url": campaign.redirect_url, "email": targets}


def message_target(message: Message, index: int | None) -> str:
    """Where the message's tracked link `index` (None: the WhatsApp button) goes: the target frozen
    when its campaign started, so what a recipient received never changes; "" when there is none.
    Only a campaign started before targets were frozen reads its (locked) content."""
    campaign = message.campaign
    frozen = campaign.sent_links if isinstance(campaign.sent_links, dict) else None
    if isinstance(message, EmailMessage):
        if index is None:
            return ""
        if frozen is not None:
            targets = [str(t) for t in frozen.get("email") or []]
        else:
            targets = list(compiled_email(campaign).links)
        return targets[index] if index < len(targets) else ""
    if index is not None:
        return ""
    return str(frozen.get("redirect_url") or "") if frozen is not None else campaign.redirect_url


def link_token(kind: str, message: Message) -> str:
    """The message's token signed for one kind of link: URL-safe, unguessable, stable. What
    `_signer(kind).sign` gives (`message_for` unsigns it), its salted key derived once per kind and
    SECRET_KEY (`_link_mac`) instead of for every link: a send batch signs two or three a message."""
    value = EMAIL_PREFIX + message.token if isinstance(message, EmailMessage) else message.token
    mac = _link_mac(kind, settings.SECRET_KEY).copy()
    mac.update(value.encode())
    return f"{value}.{signing.b64_encode(mac.digest()).decode()}"


@functools.lru_cache(maxsize=16)
def _link_mac(kind: str, secret: str) -> hmac.HMAC:
    """The HMAC a kind's signatures start from: django.utils.crypto.salted_hmac's key for the
    signer's salt ("<salt>signer") and `secret`, SHA-256 (Signer's algorithm)."""
    if kind not in KINDS:
        raise ValueError(f"unknown link kind {kind!r}")
    key = hashlib.sha256(f"campaigns.link.{kind}signer".encode() + secret.encode()).digest()
    return hmac.new(key, digestmod=hashlib.sha256)


def link_path(kind: str, message: Message) -> str:
    """The path of a message's endpoint: redirect ("r"), unsubscribe ("u") or open pixel ("o")."""
    return f"{kind}/{link_token(kind, message)}"


def link_url(kind: str, message: Message) -> str:
    """The absolute URL of `link_path` on this deployment's PUBLIC_URL (for emails)."""
    return f"{settings.PUBLIC_URL}/{link_path(kind, message)}"


def message_for(kind: str, signed: str) -> Message | None:
    """The message a token signed for `kind` names, with its campaign and customer; None when the
    signature is wrong or made for another kind (no query is made then) or no message has it."""
    try:
        value = _signer(kind).unsign(signed)
    except signing.BadSignature:
        return None
    model: type[Message] = WhatsappMessage
    if value.startswith(EMAIL_PREFIX):
        model, value = EmailMessage, value.removeprefix(EMAIL_PREFIX)
    return model.objects.select_related("campaign", "customer").filter(token=value).first()


def message_click(*, message: Message) -> bool:
    """Record the message's first click and count it on the campaign; True only for the first click.

    Safe to run twice or concurrently: the compare-and-set on clicked_at lets exactly one request count.
    A click on an email also counts as its open (images are often blocked, clicks are not).
    """
    model = type(message)
    with transaction.atomic():
        first = model.objects.filter(pk=message.pk, clicked_at__isnull=True).update(clicked_at=timezone.now())
        if first:
            CampaignMetric.objects.filter(campaign_id=message.campaign_id).update(clicked=F("clicked") + 1)
            # Once, with the first click: flows' `link_clicked` trigger and exit_on.
            hooks.customer_events(
                [
                    hooks.CustomerEvent(
                        "link_clicked",
                        message.organization_id,
                        message.customer_id,
                        timezone.now(),
                        f"{model.__name__}:{message.pk}",
                        {"campaign_id": message.campaign_id, "link_id": message.pk},
                    )
                ]
            )
    if first and isinstance(message, EmailMessage):
        message_open(message=message)
    return bool(first)


def message_open(*, message: EmailMessage) -> bool:
    """Record the email's first open and count it on the campaign; True only for the first open."""
    with transaction.atomic():
        first = EmailMessage.objects.filter(pk=message.pk, opened_at__isnull=True).update(
            opened_at=timezone.now()
        )
        if first:
            CampaignMetric.objects.filter(campaign_id=message.campaign_id).update(opened=F("opened") + 1)
    return bool(first)


def opted_out(message: Message) -> bool:
    """Whether the message's customer is already out of this channel's marketing."""
    customer = message.customer
    if isinstance(message, EmailMessage):
        return customer.email_opted_out_at is not None
    return customer.whatsapp_opted_out_at is not None


def message_unsubscribe(*, message: Message) -> bool:
    """Opt the message's customer out of the message's channel; True when this call did it.

    Safe to run twice: an existing opt-out (its time and source) is kept, never overwritten.
    """
    channel: SendingChannel = "email" if isinstance(message, EmailMessage) else "whatsapp"
    return bool(
        customers_opt_out(
            customer_ids=[message.customer_id], channel=channel, source=OptOutSource.UNSUBSCRIBE_LINK
        )
    )
