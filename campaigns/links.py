"""Signed links in WhatsApp buttons: the redirect (click tracking) and the unsubscribe endpoint.

A link carries the message's random `token` signed with SECRET_KEY, so a made-up or tampered link is
rejected by an HMAC check before the database is asked anything, and a leaked database dump of tokens
alone cannot be turned into working links.
"""

from __future__ import annotations

from django.core import signing
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from campaigns.models import CampaignMetric, WhatsappMessage
from crm.models import Customer, OptOutSource

KINDS = ("r", "u")  # r: redirect (click tracking), u: unsubscribe


def _signer() -> signing.Signer:
    # "." is URL-safe and never appears in a token_urlsafe value or in the base64url signature, so the
    # signed value needs no escaping inside the button's URL path ("r/<token>.<signature>", 68 chars).
    # Built per call so a rotated SECRET_KEY (or SECRET_KEY_FALLBACKS) is honoured.
    return signing.Signer(salt="campaigns.link", sep=".")


def link_token(message: WhatsappMessage) -> str:
    """The message's token signed for links: URL-safe, unguessable and stable for the message."""
    return _signer().sign(message.token)


def link_path(kind: str, message: WhatsappMessage) -> str:
    """The path of the redirect ("r") or unsubscribe ("u") endpoint for a message, e.g. "r/<signed>"."""
    if kind not in KINDS:
        raise ValueError(f"unknown link kind {kind!r}")
    return f"{kind}/{link_token(message)}"


def message_for(signed: str) -> WhatsappMessage | None:
    """The message a signed token names, with its campaign and customer; None when the signature is
    wrong (no query is made then) or no message has that token."""
    try:
        token = _signer().unsign(signed)
    except signing.BadSignature:
        return None
    try:
        return WhatsappMessage.objects.select_related("campaign", "customer").get(token=token)
    except WhatsappMessage.DoesNotExist:
        return None


def message_click(*, message: WhatsappMessage) -> bool:
    """Record the message's first click and count it on the campaign; True only for the first click.

    Safe to run twice or concurrently: the compare-and-set on clicked_at lets exactly one request count.
    """
    with transaction.atomic():
        first = WhatsappMessage.objects.filter(pk=message.pk, clicked_at__isnull=True).update(
            clicked_at=timezone.now()
        )
        if first:
            CampaignMetric.objects.filter(campaign_id=message.campaign_id).update(clicked=F("clicked") + 1)
    return bool(first)


def message_unsubscribe(*, message: WhatsappMessage) -> bool:
    """Opt the message's customer out of WhatsApp marketing; True when this call did it.

    Safe to run twice: an existing opt-out (its time and source) is kept, never overwritten.
    """
    now = timezone.now()
    changed = Customer.objects.filter(pk=message.customer_id, whatsapp_opted_out_at__isnull=True).update(
        whatsapp_opted_out_at=now,
        whatsapp_opt_out_source=OptOutSource.UNSUBSCRIBE_LINK,
        # .update() skips auto_now; whoever syncs on updated_at must see the opt-out.
        updated_at=now,
    )
    return bool(changed)
