"""Facts the platform announces once, whoever made them happen, and the apps that react to them.

"Sales written": every path that writes sales — the ERP sync's pages (bulk upserts, which send no
Django signal), a sale saved in the admin or through the ORM, the demo's bulk insert — calls
`sales_written` inside the transaction that wrote them. The apps register what they do with new
sales from their `AppConfig.ready` (surveys: schedule the post-sale survey; campaigns: attribute
the sale to the last message; flows: the `sale` trigger), so a new consumer plugs in once and sees
every path, and a new writer calls one function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from crm.models import Sale


@dataclass(frozen=True)
class SalesWritten:
    """Sales of one organization just inserted or changed (`created_ids` ⊆ `sale_ids`)."""

    organization_id: int
    sale_ids: tuple[int, ...]
    created_ids: tuple[int, ...]


SalesConsumer = Callable[[SalesWritten], int]


@dataclass(frozen=True)
class _Registration:
    name: str
    consumer: SalesConsumer
    order: int


_SALES_CONSUMERS: dict[str, _Registration] = {}


def on_sales_written(name: str, consumer: SalesConsumer, *, order: int = 0) -> None:
    """Register `consumer` (returns how many things it did, e.g. surveys scheduled) under `name`;
    consumers run by ascending `order`, then name. Registering a name again replaces it."""
    _SALES_CONSUMERS[name] = _Registration(name, consumer, order)


def off_sales_written(name: str) -> None:
    """Unregister the consumer named `name` (nothing happens when there is none)."""
    _SALES_CONSUMERS.pop(name, None)


def sales_consumers() -> list[str]:
    """The registered consumers' names, in the order they run."""
    return [r.name for r in sorted(_SALES_CONSUMERS.values(), key=lambda r: (r.order, r.name))]


def sales_written(
    *, organization_id: int, sale_ids: Sequence[int], created_ids: Sequence[int] = ()
) -> dict[str, int]:
    """Tell every consumer that these sales were written; returns each consumer's count by name.

    Call it inside the transaction that wrote the sales: what the consumers write commits (or
    rolls back) with them, so a sale is never written without its survey and attribution.
    """
    event = SalesWritten(
        organization_id, tuple(sale_ids), tuple(i for i in created_ids if i in set(sale_ids))
    )
    if not event.sale_ids:
        return {name: 0 for name in sales_consumers()}
    return {name: _SALES_CONSUMERS[name].consumer(event) for name in sales_consumers()}


def sale_saved(sender: type[Sale], instance: Sale, created: bool, raw: bool = False, **kwargs: Any) -> None:
    """post_save of Sale (the admin, single ORM saves, fixtures aside): one sale written."""
    if not raw:
        sales_written(
            organization_id=instance.organization_id,
            sale_ids=[instance.pk],
            created_ids=[instance.pk] if created else [],
        )


# --- Customer events -------------------------------------------------------------------------
# Facts about one customer that automation reacts to, announced by the app that saw them: a
# WhatsApp reply (conversations), a tracked link clicked (campaigns), a survey answered (surveys),
# a customer created (crm, the ERP sync), a segment entered (campaigns' segments). The emitter
# calls `customer_events` inside the transaction that recorded the fact, so a consumer's writes
# (the flows app's enrollments) commit or roll back with it: an event is acted on once, never lost.

CUSTOMER_EVENT_KINDS = frozenset(
    {"whatsapp_reply", "link_clicked", "survey_answered", "customer_created", "segment_entered"}
)


@dataclass(frozen=True)
class CustomerEvent:
    """One fact about a customer. `data` holds plain values only, per kind:
    whatsapp_reply {"text", "number_id", "message_id", "campaign_id"?}; link_clicked {"campaign_id",
    "link_id"}; survey_answered {"survey_id", "score"}; customer_created {}; segment_entered
    {"segment"}. `key` identifies the fact for deduplication (e.g. the reply's wamid)."""

    kind: str
    organization_id: int
    customer_id: int
    at: Any  # an aware datetime
    key: str = ""
    data: dict[str, Any] | None = None


EventsConsumer = Callable[[Sequence[CustomerEvent]], int]

_EVENT_CONSUMERS: dict[str, tuple[int, EventsConsumer]] = {}


def on_customer_events(name: str, consumer: EventsConsumer, *, order: int = 0) -> None:
    """Register `consumer` (returns how many things it did) under `name`; by ascending `order`."""
    _EVENT_CONSUMERS[name] = (order, consumer)


def off_customer_events(name: str) -> None:
    _EVENT_CONSUMERS.pop(name, None)


def customer_events(events: Sequence[CustomerEvent]) -> dict[str, int]:
    """Tell every consumer about these events (one call per batch: a bulk path passes them all at
    once); returns each consumer's count by name. Call it inside the recording transaction."""
    unknown = {e.kind for e in events} - CUSTOMER_EVENT_KINDS
    if unknown:
        raise ValueError(f"unknown customer event kind(s): {sorted(unknown)}")
    names = sorted(_EVENT_CONSUMERS, key=lambda n: (_EVENT_CONSUMERS[n][0], n))
    if not events:
        return {name: 0 for name in names}
    return {name: _EVENT_CONSUMERS[name][1](events) for name in names}


def customer_saved(sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    """post_save of Customer (the admin, single ORM saves; a bulk path announces its own):
    `customer_created` once, in the transaction that created it."""
    if created and not raw:
        customer_events(
            [
                CustomerEvent(
                    "customer_created",
                    instance.organization_id,
                    instance.pk,
                    instance.created_at,
                    f"c:{instance.pk}",
                )
            ]
        )
