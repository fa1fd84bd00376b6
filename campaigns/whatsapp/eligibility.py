"""Who in a claimed batch may receive it now, grouped by the number it goes from."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.utils import timezone

from campaigns import caps, lifecycle
from campaigns.models import Campaign, WhatsappMessage
from campaigns.variables import CUSTOMER_FIELDS
from campaigns.whatsapp.templates import _empty_variable, _template_message, store_names, template_values
from crm import ratelimit
from integrations.models import WhatsappNumber
from integrations.whatsapp.client import GraphClient, TemplateMessage
from integrations.whatsapp.phones import normalize_phone


@dataclass
class _Lane:
    """One sending number's share of a batch: its credentials, its pacing slots, its messages."""

    number: WhatsappNumber
    items: list[tuple[WhatsappMessage, TemplateMessage]]
    token: str = ""
    client: GraphClient | None = None
    slots: ratelimit.Slots = field(default_factory=lambda: ratelimit.Slots(0.0, 0.0))


# --- Eligibility ---------------------------------------------------------------------------------

# What a send reads of a message and its customer (the rest of their columns stays in the table:
# a chunk's rows are built in ~half the time). Its writes set their fields before reading them.
_LOADED = (
    *("organization_id", "campaign_id", "batch", "customer_id", "whatsapp_number_id"),
    *("attempts", "status", "phone", "token"),
    *(f"customer__{f}" for f in ("phone", "marketing_consent", "whatsapp_opted_out_at", *CUSTOMER_FIELDS)),
)


def batch_eligible(
    *, campaign: Campaign, ids: list[int]
) -> tuple[list[WhatsappMessage], dict[int, str], list[_Lane]]:
    """The claimed messages `ids`: (all of them, those to skip with their reason, the rest by the
    number they go from, each with its template message). Skipped: opted out or without consent, an
    invalid phone, over a contact cap (checked again now), an empty template variable. A message
    whose customer is gone is skipped on the spot; a valid phone is kept in its E.164 form."""
    rows = WhatsappMessage.objects.filter(id__in=ids).select_related("customer").only(*_LOADED)
    messages = list(rows.order_by("id"))
    lifecycle.skip_without_customer(model=WhatsappMessage, campaign_id=campaign.pk, ids=ids, found=messages)
    numbers = _senders(campaign, messages)
    names = store_names(numbers)
    # Time has passed since the fan-out applied the contact caps (campaigns.caps).
    capped = caps.skip_reasons(
        campaign=campaign, customer_ids=[m.customer_id for m in messages], now=timezone.now()
    )
    skipped: dict[int, str] = {}
    lanes: dict[int, _Lane] = {}
    for m in messages:
        number_id = m.whatsapp_number_id
        assert number_id is not None  # _senders gave every message one
        body = template_values(
            customer=m.customer,
            sources=campaign.template_variables,
            store_name=names.get(number_id, ""),
        )
        reason = _skip_reason(m, capped) or _empty_variable(campaign, body)
        if reason:
            skipped[m.pk] = reason
            continue
        lane = lanes.get(number_id) or lanes.setdefault(number_id, _Lane(numbers[number_id], []))
        lane.items.append((m, _template_message(campaign, m, body)))
    return messages, skipped, list(lanes.values())


def _senders(campaign: Campaign, messages: list[WhatsappMessage]) -> dict[int, WhatsappNumber]:
    """The numbers the messages go from, by id. A message without one (older than the choice), or
    whose number was deleted since the fan-out, goes from the campaign's number."""
    own = campaign.whatsapp_number
    assert own is not None
    wanted = {m.whatsapp_number_id for m in messages} - {None, own.pk}
    numbers = {own.pk: own, **WhatsappNumber.objects.select_related("store").in_bulk(list(wanted))}
    for m in messages:
        if m.whatsapp_number_id not in numbers:
            m.whatsapp_number_id = own.pk
    return numbers


def _skip_reason(m: WhatsappMessage, capped: dict[int, str]) -> str:
    """Why the message must not go to its customer now, or "": consent, a valid phone (the message
    takes its E.164 form), the contact caps."""
    customer = m.customer
    if not customer.marketing_consent:
        return caps.NO_CONSENT
    if not customer.can_receive_whatsapp:
        return "customer opted out or has no phone"
    phone = normalize_phone(customer.phone)
    if phone is None:
        return f"invalid phone number {customer.phone!r}"
    m.phone = phone
    if m.customer_id in capped:
        return capped[m.customer_id]
    return ""
