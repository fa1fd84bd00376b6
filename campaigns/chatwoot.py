"""Mirroring sent campaign messages to the organization's Chatwoot, as a job of its own.

The seed's step 11 ("syncToChatwoot, fire-and-forget"): the send only enqueues the mirror and a
Chatwoot that is down, slow or misconfigured never touches a send, its status or the metrics.
Each message is marked `chatwoot_mirrored_at` right after Chatwoot accepted it, so a retried job
skips what an earlier attempt already mirrored.
"""

from __future__ import annotations

import contextlib
import logging

from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone

from campaigns import sending
from campaigns.models import Campaign, WhatsappMessage
from crm import jobs, queues
from integrations.chatwoot.client import ChatwootClient
from integrations.errors import IntegrationError
from integrations.models import ChatwootAccount

logger = logging.getLogger(__name__)

Status = WhatsappMessage.Status
MIRRORED_STATUSES = (Status.SENT, Status.DELIVERED, Status.READ)
MIRROR_TASK = "campaigns.tasks.chatwoot_mirror"
# No queue of its own (crm/queues.py is the registry): housekeeping-grade work, served last.
MIRROR_QUEUE = queues.CHATWOOT_MIRROR
MIRROR_CHUNK = 50
MIRROR_ATTEMPTS = 3
MIRROR_BACKOFF = 30  # seconds before the first retry, doubled after; module-level so tests shorten it
# A token Chatwoot refuses is refused for every message: stop asking for the rest of the batch.
_ACCOUNT_LEVEL_STATUSES = (401, 403)


def chatwoot_enqueue_mirror(*, campaign_id: int, message_ids: list[int]) -> None:
    """Enqueue one mirror job for these messages if the campaign's organization has Chatwoot enabled."""
    if not message_ids:
        return
    organization_id = (
        ChatwootAccount.objects.filter(organization__campaigns__id=campaign_id, enabled=True)
        .values_list("organization_id", flat=True)
        .first()
    )
    if organization_id is None:
        return
    ids = [int(pk) for pk in message_ids]
    # Small jobs: each message costs up to three sequential Chatwoot calls.
    jobs.enqueue_many(
        MIRROR_TASK,
        queue=MIRROR_QUEUE,
        kwargs_list=[{"message_ids": ids[i : i + MIRROR_CHUNK]} for i in range(0, len(ids), MIRROR_CHUNK)],
        attempts=MIRROR_ATTEMPTS,
        backoff=MIRROR_BACKOFF,
        organization_id=organization_id,
    )


def chatwoot_message_content(message: WhatsappMessage) -> str:
    """What an agent reads in Chatwoot: "[campanha <name>] <template>: <variables, comma-separated>"."""
    campaign: Campaign = message.campaign
    number = campaign.whatsapp_number
    store_name = number.store.name if number is not None and number.store is not None else ""
    # The same rendering the send used (sending's step 6), so the agent sees what the customer got.
    values = sending.template_values(
        customer=message.customer, sources=campaign.template_variables, store_name=store_name
    )
    text = f"[campanha {campaign.name}] {campaign.template_name}"
    return f"{text}: {', '.join(values)}" if values else text


def _account_of(message: WhatsappMessage) -> ChatwootAccount | None:
    try:
        account: ChatwootAccount = message.organization.chatwoot
    except ObjectDoesNotExist:
        return None
    return account if account.enabled else None


def chatwoot_mirror_batch(*, message_ids: list[int]) -> int:
    """Mirror each sent, not yet mirrored message once; returns how many were mirrored. Safe to run twice.

    Raises the IntegrationError of a retryable failure (RQ retries the job); a non-retryable one
    is logged and the message left unmirrored.
    """
    messages = list(
        WhatsappMessage.objects.filter(
            id__in=message_ids, status__in=MIRRORED_STATUSES, chatwoot_mirrored_at__isnull=True
        )
        .select_related("customer", "campaign__whatsapp_number__store", "organization__chatwoot")
        .order_by("id")
    )
    mirrored = 0
    clients: dict[int, ChatwootClient] = {}
    refused: set[int] = set()  # accounts whose token Chatwoot refused in this run
    # Per account and phone: (contact_id, conversation_id), so a batch asks Chatwoot once per phone.
    threads: dict[tuple[int, str], tuple[int, int]] = {}
    with contextlib.ExitStack() as stack:
        for message in messages:
            account = _account_of(message)
            if account is None or account.pk in refused:
                continue
            log_extra = {"organization_id": message.organization_id, "campaign_id": message.campaign_id}
            if not message.phone:
                logger.warning(
                    "chatwoot mirror: message %s has no phone; skipped", message.pk, extra=log_extra
                )
                continue
            client = clients.get(account.pk)
            if client is None:
                client = stack.enter_context(
                    ChatwootClient(
                        base_url=account.base_url,
                        account_id=account.account_id,
                        api_token=account.get_api_token(),  # fresh from the database, in memory only
                    )
                )
                clients[account.pk] = client
            try:
                _mirror_one(client, account, message, threads)
            except IntegrationError as exc:
                if exc.retryable:
                    raise
                if exc.status in _ACCOUNT_LEVEL_STATUSES:
                    refused.add(account.pk)
                    logger.error(
                        "chatwoot mirror: account %s refused our token (%s %s); its messages stay unmirrored",
                        account.pk,
                        exc,
                        exc.details,
                        extra=log_extra,
                    )
                    continue
                logger.warning(
                    "chatwoot mirror: message %s not mirrored: %s %s",
                    message.pk,
                    exc,
                    exc.details,
                    extra=log_extra,
                )
                continue
            # Compare-and-set: a concurrent run that got there first is not counted twice.
            mirrored += WhatsappMessage.objects.filter(
                pk=message.pk, chatwoot_mirrored_at__isnull=True
            ).update(chatwoot_mirrored_at=timezone.now())
    return mirrored


def _mirror_one(
    client: ChatwootClient,
    account: ChatwootAccount,
    message: WhatsappMessage,
    threads: dict[tuple[int, str], tuple[int, int]],
) -> int:
    """Post one message to the contact's conversation in the account's inbox; returns Chatwoot's id."""
    key = (account.pk, message.phone)
    if key not in threads:
        contact_id, source_id = client.contact_find_or_create(
            phone_e164=message.phone, name=message.customer.name, inbox_id=account.inbox_id
        )
        conversation_id = client.conversation_find_or_create(
            contact_id=contact_id, source_id=source_id, inbox_id=account.inbox_id
        )
        threads[key] = (contact_id, conversation_id)
    return client.message_create(
        conversation_id=threads[key][1],
        content=chatwoot_message_content(message),
        # An API-channel inbox never forwards an outgoing message to WhatsApp; a private note is
        # for organizations that mirror into the WhatsApp inbox's own conversations.
        private=account.mode == ChatwootAccount.Mode.PRIVATE_NOTE,
        content_attributes={"campaign_message_id": message.pk},
    )
