"""Mirroring sent campaign messages to the organization's Chatwoot, through the conversations' push.

The seed's step 11 ("syncToChatwoot, fire-and-forget"): a sent message gets a copy in its
customer's conversation (`ConversationMessage`, source "campaign", waiting for Chatwoot), written in
one statement per batch, and messaging.chatwoot_inbound's push delivers it with the customer's own
messages, in order per conversation. So a mirror waits in PostgreSQL, never in Redis: Chatwoot down,
its token wrong, a worker killed or Redis flushed, the copy is delivered when Chatwoot answers again
(the push defers itself while Chatwoot is down; saving the account with a fixed token pushes at
once; `recover` pushes every organization with messages waiting). Chatwoot never touches a send,
its status or the metrics. `WhatsappMessage.chatwoot_mirrored_at` is when the copy was made (the
message is handed to the conversation once); whether Chatwoot took it is the copy's
`chatwoot_pending`.
"""

from __future__ import annotations

import functools
import logging

from django.db import transaction
from django.utils import timezone

from campaigns.models import Campaign, WhatsappMessage
from campaigns.whatsapp import templates
from integrations.models import ChatwootAccount, WhatsappNumber
from messaging import chatwoot_inbound
from messaging.models import ConversationMessage

logger = logging.getLogger(__name__)

Status = WhatsappMessage.Status
MIRRORED_STATUSES = (Status.SENT, Status.DELIVERED, Status.READ)
# Kept for the chatwoot_mirror jobs enqueued before the mirror went through the conversations.
MIRROR_TASK = "campaigns.tasks.chatwoot_mirror"


def chatwoot_enabled(*, campaign_id: int) -> bool:
    """Whether the campaign's organization has its Chatwoot enabled (its sent messages mirrored)."""
    return ChatwootAccount.objects.filter(organization__campaigns__id=campaign_id, enabled=True).exists()


def chatwoot_enqueue_mirror(*, campaign_id: int, message_ids: list[int]) -> None:
    """Hand these sent messages to the organization's Chatwoot if it has one enabled: each gets its
    copy waiting in the conversation, and a push is enqueued (after commit)."""
    if not message_ids:
        return
    organization_id = (
        ChatwootAccount.objects.filter(organization__campaigns__id=campaign_id, enabled=True)
        .values_list("organization_id", flat=True)
        .first()
    )
    if organization_id is not None:
        chatwoot_mirror_batch(message_ids=message_ids)


def chatwoot_message_content(message: WhatsappMessage) -> str:
    """What an agent reads in Chatwoot: "[campanha <name>] <template>: <variables, comma-separated>"."""
    campaign: Campaign = message.campaign
    number = campaign.whatsapp_number
    store_name = number.store.name if number is not None and number.store is not None else ""
    # The same rendering the send used (sending's step 6), so the agent sees what the customer got.
    values = templates.template_values(
        customer=message.customer, sources=campaign.template_variables, store_name=store_name
    )
    text = f"[campanha {campaign.name}] {campaign.template_name}"
    return f"{text}: {', '.join(values)}" if values else text


def chatwoot_mirror_batch(*, message_ids: list[int]) -> int:
    """Make the conversation copy of each sent message not handed over yet, for organizations with
    Chatwoot enabled, and enqueue their pushes (after the commit, a failure only logged); returns
    how many. Safe to run twice:
    a message is claimed once (`chatwoot_mirrored_at`), in the transaction that writes its copy."""
    with transaction.atomic():
        claimed = list(
            WhatsappMessage.objects.filter(
                id__in=message_ids,
                status__in=MIRRORED_STATUSES,
                chatwoot_mirrored_at__isnull=True,
                organization__chatwoot__enabled=True,
            )
            .exclude(phone="")
            .select_for_update(skip_locked=True, of=("self",))
            .select_related("customer", "campaign__whatsapp_number__store")
            .order_by("id")
        )
        if not claimed:
            return 0
        WhatsappMessage.objects.filter(id__in=[m.pk for m in claimed]).update(
            chatwoot_mirrored_at=timezone.now()
        )
        ConversationMessage.objects.bulk_create(_copies(claimed))
        for organization_id in {m.organization_id for m in claimed}:
            # Robust: Redis failing after the commit fails no send (`recover` pushes what waits).
            transaction.on_commit(
                functools.partial(chatwoot_inbound.push_enqueue, organization_id=organization_id),
                robust=True,
            )
    return len(claimed)


def _copies(messages: list[WhatsappMessage]) -> list[ConversationMessage]:
    """Each message as an outgoing line of its customer's conversation, from the number it was sent
    from (the campaign's when that one is gone) and that number's store, waiting for Chatwoot."""
    wanted = {m.whatsapp_number_id or m.campaign.whatsapp_number_id for m in messages}
    numbers = {n.pk: n for n in WhatsappNumber.objects.filter(pk__in=wanted - {None})}
    copies = []
    for message in messages:
        number = numbers.get(message.whatsapp_number_id or 0) or numbers.get(
            message.campaign.whatsapp_number_id or 0
        )
        copies.append(
            ConversationMessage(
                organization_id=message.organization_id,
                customer_id=message.customer_id,
                whatsapp_number=number,
                store_id=number.store_id if number is not None else None,
                direction=ConversationMessage.Direction.OUTBOUND,
                kind="text",
                text=chatwoot_message_content(message),
                campaign_id=message.campaign_id,
                campaign_message_id=message.pk,
                at=message.sent_at or timezone.now(),
                status=ConversationMessage.Status.SENT,
                source=ConversationMessage.Source.CAMPAIGN,
                chatwoot_pending=True,
            )
        )
    return copies
