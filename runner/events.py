"""Webhook and AMQP intake of the runner: events recorded once by their id (or their bytes), stored
as executions of one item each, fanned out on the webhook priority."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from crm import bulk, inbox_intake, inbox_kinds, jobs
from runner.executions import fan_out, item_specs, settle
from runner.models import (
    EVENT_ID_MAX,
    Execution,
    ExecutionItem,
    Handler,
    Trigger,
    WebhookEvent,
)

logger = logging.getLogger(__name__)

# How long a webhook event id is remembered (a provider's retries come within hours).
WEBHOOK_EVENT_KEEP = timedelta(days=7)
WEBHOOK_KIND = "runner.webhook"  # the inbox kind of accepted webhooks

_TABLE = Execution._meta.db_table
_EVENTS = WebhookEvent._meta.db_table


def event_key(event_id: str) -> str:
    """How a sender's event id is recorded: as it is, or a SHA-256 of it when it is longer than the
    column (200), so two long ids that share a beginning stay two ids. "" stays "" (no id)."""
    if len(event_id) <= EVENT_ID_MAX:
        return event_id
    return "sha256:" + hashlib.sha256(event_id.encode("utf-8", "surrogatepass")).hexdigest()


def content_key(body: bytes) -> str:
    """The event id of a delivery without a sender's id: a SHA-256 of its exact bytes (see
    events_store's "content_id")."""
    return "body-sha256:" + hashlib.sha256(body).hexdigest()


def events_store(
    *,
    handler: Handler,
    organization_id: int,
    trigger: str,
    events: list[dict[str, Any]],
) -> Execution | None:
    """Store incoming events as the items of a new execution; returns only once they are committed.

    The extension point of every push trigger: the webhook intake calls it, and so does a queue
    consumer (AMQP) before it acknowledges its messages. Each event is {"external_id", "payload"}
    and may carry an "event_id": its sender's id for it (a webhook's X-Event-Id, an AMQP
    message_id; never a body's own `id`, which usually names a record that may change again). An
    event whose id this handler and organization have seen (within WEBHOOK_EVENT_KEEP), or that
    repeats an id earlier in `events`, is a redelivery and is not stored again. Ids are compared
    whole (`event_key` hashes a long one, never cuts it).

    An event without a sender's id may carry a "content_id" (`content_key` of its exact bytes) and
    "redelivered" (the broker's flag: it may have been delivered before). Its content id is
    recorded every time, but checked only on a redelivery: a first delivery is always stored (a
    publisher may send the same bytes twice on purpose), a redelivery is stored unless an earlier
    call recorded the same content (then it is the delivery that call stored, given again because
    its acknowledgement was lost).

    The new ids are recorded in the transaction that stores their items, so a concurrent call
    with one of the checked ids raises IntegrityError and stores nothing. Returns None when every
    event was such a duplicate (no execution is created).
    """
    now = timezone.now()
    with transaction.atomic(durable=True):
        fresh = _fresh_events(handler, organization_id, events)
        if events and not fresh.events:
            return None
        execution = Execution.objects.create(
            organization_id=organization_id,
            integration_id=handler.integration_id,
            handler=handler,
            direction=handler.direction,
            trigger=trigger,
            status=Execution.Status.RUNNING,
            started_at=now,
            fanned_out_at=now,
            items_total=len(fresh.events),
            items_remaining=len(fresh.events),
        )
        _event_ids_record(handler, organization_id, execution, fresh)
        items = ExecutionItem.objects.bulk_create(
            [
                ExecutionItem(
                    execution=execution,
                    external_id=str(e.get("external_id") or "")[:200],
                    payload=e.get("payload"),
                )
                for e in fresh.events
            ]
        )
        fan_out(execution, handler, [i.pk for i in items])
        if not fresh.events:
            settle(execution.pk)
    bulk.analyze_if_grown(ExecutionItem, len(fresh.events))  # or every item job's claim scans the table
    return execution


@dataclass
class _FreshEvents:
    """What events_store stores of a call's events: the ones not delivered before, the ids to
    record plainly (a concurrent delivery of one meets IntegrityError), and the content ids of first
    deliveries (recorded if absent, never refused)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    checked: dict[str, None] = field(default_factory=dict)
    first_content: dict[str, None] = field(default_factory=dict)


def _fresh_events(handler: Handler, organization_id: int, events: list[dict[str, Any]]) -> _FreshEvents:
    """The events that are not redeliveries (events_store's rules), in the caller's transaction."""
    senders = [event_key(str(e.get("event_id") or "")) for e in events]
    contents = [
        "" if sender else str(e.get("content_id") or "") for sender, e in zip(senders, events, strict=True)
    ]
    checked = [
        bool(s) or bool(c and e.get("redelivered")) for s, c, e in zip(senders, contents, events, strict=True)
    ]
    lookup = {s or c for s, c, check in zip(senders, contents, checked, strict=True) if check}
    recorded = (
        set(
            WebhookEvent.objects.filter(
                handler=handler, organization_id=organization_id, event_id__in=lookup
            ).values_list("event_id", flat=True)
        )
        if lookup
        else set()
    )
    seen = set(recorded)
    fresh = _FreshEvents()
    for sender, content, check, event in zip(senders, contents, checked, events, strict=True):
        if sender:
            if sender in seen:
                continue
            seen.add(sender)
            fresh.checked[sender] = None
        elif content and check:
            if content in recorded:  # only an earlier call's record: two deliveries in this one are two
                continue
            fresh.checked[content] = None
        elif content:
            fresh.first_content[content] = None
        fresh.events.append(event)
    return fresh


def _event_ids_record(
    handler: Handler, organization_id: int, execution: Execution, fresh: _FreshEvents
) -> None:
    """Record the new event ids for `execution`, in the transaction that stores its items."""
    WebhookEvent.objects.bulk_create(
        [
            WebhookEvent(handler=handler, organization_id=organization_id, event_id=i, execution=execution)
            for i in fresh.checked
        ]
    )
    first = [i for i in fresh.first_content if i not in fresh.checked]
    if first:
        # The newest copy's redelivery is what must be recognised: its record is kept from now.
        WebhookEvent.objects.bulk_create(
            [
                WebhookEvent(
                    handler=handler, organization_id=organization_id, event_id=i, execution=execution
                )
                for i in first
            ],
            update_conflicts=True,
            unique_fields=["handler", "organization", "event_id"],
            update_fields=["received_at", "execution"],
        )


def webhook_receive(
    *, handler: Handler, organization_id: int, event_id: str, payload: Any, external_id: str = ""
) -> tuple[int | None, bool]:
    """Accept one webhook event, once per event id; returns (execution id, duplicate).

    One SQL statement, committed through the inbox's group commit (which runs it once for every
    request of the process waiting with this one, `_RECEIVE`): it records the event id (handler,
    organization, id — unique, kept WEBHOOK_EVENT_KEEP; `ON CONFLICT DO NOTHING`) with the
    execution id the event will have (drawn from the executions' sequence), and only if that id
    was new, the event in the inbox (crm/inbox.py). A worker drains the inbox in batches: the
    executions and items in bulk, their item jobs in pipelines (`webhooks_store`), so the request
    makes no Redis round trip and touches none of the execution tables' indexes and foreign keys.
    A retry of an event, even one racing the first delivery (or in the same group commit), stores
    nothing and learns the first execution. Events without an id are accepted every time."""
    key = event_key(event_id)
    row = inbox_intake.write(
        _RECEIVE,
        [
            handler.pk,
            organization_id,
            key,
            str(external_id or event_id)[:200],
            json.dumps(payload),
            timezone.now(),
        ],
    )
    created, earlier = row if row is not None else (None, None)
    if created is not None:
        inbox_intake.notify(WEBHOOK_KIND)
        return created, False
    if earlier is None and key:  # a concurrent delivery committed after this statement's snapshot
        earlier = (
            WebhookEvent.objects.filter(handler=handler, organization_id=organization_id, event_id=key)
            .values_list("execution_id", flat=True)
            .first()
        )
    return earlier, True


# Per request row: whether it created an execution (its id) or repeats an event id recorded before
# it (the first delivery's execution). Within one statement, the first row of an event id is the
# delivery; later rows with that id are its repeats.
_RECEIVE = inbox_intake.Statement(
    f"""
    WITH firsts AS (
        SELECT DISTINCT ON (handler_id, organization_id, event_id) n FROM requests
        WHERE event_id <> '' ORDER BY handler_id, organization_id, event_id, n
    ), ev AS (
        INSERT INTO {_EVENTS} (handler_id, organization_id, event_id, received_at, execution_id)
        SELECT r.handler_id, r.organization_id, r.event_id, r.received_at,
               nextval(pg_get_serial_sequence('{_TABLE}', 'id'))
        FROM requests r JOIN firsts USING (n) ORDER BY n
        ON CONFLICT (handler_id, organization_id, event_id) DO NOTHING
        RETURNING handler_id, organization_id, event_id, execution_id
    ), created AS (
        SELECT r.n, ev.execution_id
        FROM requests r JOIN firsts USING (n) JOIN ev USING (handler_id, organization_id, event_id)
        UNION ALL
        SELECT n, nextval(pg_get_serial_sequence('{_TABLE}', 'id')) FROM requests WHERE event_id = ''
    ), ib AS (
        INSERT INTO {inbox_intake.TABLE} (kind, organization_id, payload, error)
        SELECT '{WEBHOOK_KIND}', r.organization_id, json_build_object(
            'execution_id', c.execution_id, 'handler_id', r.handler_id,
            'organization_id', r.organization_id, 'external_id', r.external_id,
            'payload', r.payload::json)::text, ''
        FROM created c JOIN requests r USING (n) ORDER BY n
    )
    SELECT r.n, c.execution_id, CASE WHEN c.n IS NULL AND r.event_id <> '' THEN COALESCE(
        (SELECT ev.execution_id FROM ev WHERE (ev.handler_id, ev.organization_id, ev.event_id)
            = (r.handler_id, r.organization_id, r.event_id)),
        (SELECT e.execution_id FROM {_EVENTS} e WHERE (e.handler_id, e.organization_id, e.event_id)
            = (r.handler_id, r.organization_id, r.event_id))) END
    FROM requests r LEFT JOIN created c USING (n)
    """,  # noqa: S608 - table names and a constant only
    (
        ("handler_id", "bigint"),
        ("organization_id", "bigint"),
        ("event_id", "text"),
        ("external_id", "text"),
        ("payload", "text"),
        ("received_at", "timestamptz"),
    ),
)


def webhooks_store(events: list[inbox_kinds.Event]) -> None:
    """The inbox handler of accepted webhooks: their executions (with the ids the requests
    answered) and items in bulk, and the item jobs enqueued in pipelines after commit."""
    accepted = [json.loads(e.payload) for e in events]
    handlers = Handler.objects.select_related("integration").in_bulk({a["handler_id"] for a in accepted})
    now = timezone.now()
    accepted = [a for a in accepted if a["handler_id"] in handlers]  # a handler deleted meanwhile
    executions = Execution.objects.bulk_create(
        [
            Execution(
                pk=a["execution_id"],
                organization_id=a["organization_id"],
                integration_id=handlers[a["handler_id"]].integration_id,
                handler_id=a["handler_id"],
                direction=handlers[a["handler_id"]].direction,
                trigger=Trigger.WEBHOOK,
                status=Execution.Status.RUNNING,
                started_at=now,
                fanned_out_at=now,
                items_total=1,
                items_remaining=1,
            )
            for a in accepted
        ]
    )
    items = ExecutionItem.objects.bulk_create(
        [
            ExecutionItem(execution_id=a["execution_id"], external_id=a["external_id"], payload=a["payload"])
            for a in accepted
        ]
    )
    jobs.enqueue_specs(
        spec
        for execution, item in zip(executions, items, strict=True)
        for spec in item_specs(execution, handlers[execution.handler_id], [item.pk])
    )
    bulk.analyze_if_grown(ExecutionItem, len(items))


def webhook_events_prune(*, now: datetime | None = None, limit: int = 10_000) -> int:
    """Forget event ids older than WEBHOOK_EVENT_KEEP (at most `limit` per call; the
    runner-event-ids-prune cron calls it until nothing is left)."""
    cutoff = (now or timezone.now()) - WEBHOOK_EVENT_KEEP
    ids = list(WebhookEvent.objects.filter(received_at__lt=cutoff).values_list("id", flat=True)[:limit])
    if ids:
        WebhookEvent.objects.filter(id__in=ids).delete()
    return len(ids)
