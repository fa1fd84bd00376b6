"""The runner's queue trigger: read an AMQP queue and store its messages as items (priority 3).

`BatchConsumer` is the loop of `manage.py runner_consume`, in four named steps: receive a batch,
classify it (JSON events, and poison: bodies that can never be stored), store it with one `events_store`
call, acknowledge it with one outcome per message. A message is acknowledged only after its item
is committed: a consumer killed at any point leaves its unacknowledged messages to be redelivered.
A redelivery of a stored message is recognised and acknowledged without being stored again: by
its message_id, or, without one, by the hash of its body when the broker marks it redelivered
(see `events.events_store`). A body is read as the HTTP intakes read theirs (`crm.intake.parse_json`:
UTF-8, nesting, numbers, NUL), after its content_encoding (gzip) is undone within
RUNNER_AMQP_MAX_BYTES (`amqp.decoded_body`); a poison message is refused without requeue, so the
broker dead-letters it (see `amqp.open_queue`) and the consumer goes on. A lost channel or
connection is reopened with backoff; after `reconnect_for` seconds without a broker, `run` raises
ConsumerGone.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, DataError, InterfaceError, close_old_connections
from pika.exceptions import AMQPError
from redis.exceptions import RedisError

from crm import intake
from integrations.runner import amqp
from integrations.runner.amqp import Message, Outcome
from runner import conf, events
from runner.models import Handler

logger = logging.getLogger("runner.consume")

# Test-only hooks: seconds to wait after the first batch is received and before it is stored, so
# a test can kill the consumer (or close its connection) in that gap deterministically; and the
# same after the first batch is stored and before it is acknowledged. Never set them in production.
PAUSE_ENV = "CRM_TEST_CONSUME_PAUSE_BEFORE_STORE"
ACK_PAUSE_ENV = "CRM_TEST_CONSUME_PAUSE_BEFORE_ACK"
BACKOFF_MAX = 30.0


class Poison(ValueError):
    """A message that can never be stored: undecodable, too large, or not strict JSON."""


def event_of(message: Message, *, max_bytes: int = amqp.DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """The event a message carries (for `events.events_store`); raises Poison if it has none.

    The item's external id is the message_id, else the body's `id`. Only the message_id is the
    event's id (a body's `id` usually names a record, which may change again); a message without
    one is recognised on redelivery by the hash of its exact body."""
    try:
        payload = intake.parse_json(amqp.decoded_body(message, max_bytes=max_bytes))
    except (amqp.Undecodable, intake.BadBody) as exc:
        raise Poison(str(exc)[:200]) from None
    body_id = payload.get("id") if isinstance(payload, dict) else ""
    event: dict[str, Any] = {"external_id": str(message.message_id or body_id or ""), "payload": payload}
    if message.message_id:
        event["event_id"] = message.message_id
    else:
        event["content_id"] = events.content_key(message.body)
        event["redelivered"] = message.redelivered
    return event


class ConsumerGone(Exception):
    """The broker could not be reached again within `reconnect_for` seconds."""


@dataclass
class Tally:
    handled: int = 0  # settled: stored, already stored or dropped
    stored: int = 0
    dropped: int = 0
    duplicates: int = 0
    reconnects: int = 0


@dataclass(frozen=True)
class Batch:
    messages: list[Message]
    events: list[dict[str, Any]]  # one per message of `kept`
    kept: list[Message]
    poison: list[Message]  # never storable: dropped (dead-lettered)


class BatchConsumer:
    """Consume `queue` into queue-triggered executions of `handler` for one organization."""

    def __init__(
        self,
        *,
        handler: Handler,
        organization_id: int,
        url: str,
        queue: str,
        prefetch: int = 100,
        batch: int = 100,
        max_messages: int = 0,
        idle_exit: float = 0.0,
        reconnect_for: float = 300.0,
    ) -> None:
        self.handler = handler
        self.organization_id = organization_id
        self.url = url
        self.queue = queue
        self.prefetch = prefetch
        self.batch_size = max(1, batch)
        self.max_messages = max(0, max_messages)
        self.idle_exit = max(0.0, idle_exit)
        self.reconnect_for = max(0.0, reconnect_for)
        self.max_bytes = int(conf.get("RUNNER_AMQP_MAX_BYTES"))
        self.tally = Tally()
        self.stopping = False
        self._pause = float(os.environ.get(PAUSE_ENV) or 0)
        self._ack_pause = float(os.environ.get(ACK_PAUSE_ENV) or 0)
        self._backoff = 1.0
        self._last_message = time.monotonic()
        self.consumer: amqp.Consumer | None = None

    def stop(self) -> None:
        """Finish the batch in hand, then return from `run` (safe from a signal handler)."""
        self.stopping = True

    def run(self) -> Tally:
        """Consume until stopped, idle or `max_messages` handled; raises AMQPError if the broker
        cannot be reached at the start, ConsumerGone if it cannot be reached again later."""
        self.consumer = amqp.Consumer(self.url, self.queue, prefetch=self.prefetch, max_bytes=self.max_bytes)
        try:
            while not self.stopping:
                try:
                    if not self._step(self.consumer):
                        break
                except amqp.ConsumerLost as lost:
                    self._reconnect(self.consumer, lost)
        finally:
            self.consumer.close()
        return self.tally

    def _step(self, consumer: amqp.Consumer) -> bool:
        """One batch through receive → classify → store → acknowledge; False once done."""
        want = self.batch_size
        if self.max_messages:
            want = min(want, self.max_messages - self.tally.handled)
        if want <= 0:
            return False
        messages = self.receive(consumer, want)
        if not messages:
            if self.idle_exit and time.monotonic() - self._last_message >= self.idle_exit:
                logger.info("idle for %.1f s: exiting", self.idle_exit)
                return False
            return True
        self._last_message = time.monotonic()
        batch = self.classify(messages)
        if self._pause:
            logger.warning(
                "test hook %s: %d messages received, storing in %.1f s", PAUSE_ENV, len(messages), self._pause
            )
            pause, self._pause = self._pause, 0.0
            consumer.sleep(pause)
        outcomes = self.store(batch)
        if self._ack_pause and any(o is Outcome.ACK for _m, o in outcomes):
            logger.warning("test hook %s: stored, acknowledging in %.1f s", ACK_PAUSE_ENV, self._ack_pause)
            pause, self._ack_pause = self._ack_pause, 0.0
            consumer.sleep(pause)
        self.acknowledge(consumer, outcomes)
        if any(o is Outcome.REQUEUE for _m, o in outcomes):  # the database failed: back off
            consumer.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, BACKOFF_MAX)
        return True

    def receive(self, consumer: amqp.Consumer, want: int) -> list[Message]:
        return consumer.fetch(want)

    def classify(self, messages: list[Message]) -> Batch:
        events: list[dict[str, Any]] = []
        kept: list[Message] = []
        poison: list[Message] = []
        for message in messages:
            try:
                event = event_of(message, max_bytes=self.max_bytes)
            except Poison as exc:
                logger.warning(
                    "message %s on %s refused, dead-lettered: %s",
                    message.message_id or message.delivery_tag,
                    self.queue,
                    exc,
                )
                poison.append(message)
            else:
                events.append(event)
                kept.append(message)
        return Batch(messages=messages, events=events, kept=kept, poison=poison)

    def store(self, batch: Batch) -> list[tuple[Message, Outcome]]:
        """Store the batch's events; returns every message's outcome (the poison ones dropped)."""
        outcomes = [(m, Outcome.DROP) for m in batch.poison]
        if not batch.events:
            return outcomes
        close_old_connections()
        try:
            execution = events.events_store(
                handler=self.handler,
                organization_id=self.organization_id,
                trigger="queue",
                events=batch.events,
            )
        except DataError:
            # The data itself is refused (e.g. a NUL character jsonb rejects): isolate it.
            logger.exception("storing %d messages failed: storing them one by one", len(batch.events))
            return outcomes + self._store_one_by_one(batch)
        except (DatabaseError, InterfaceError) as exc:
            # Not stored (database down, schema not migrated…): everything goes back to the queue.
            logger.error(
                "storing %d messages failed, requeued; retry in %.0f s: %s",
                len(batch.events),
                self._backoff,
                exc,
            )
            return outcomes + [(m, Outcome.REQUEUE) for m in batch.kept]
        except RedisError as exc:
            # events_store commits before it enqueues the item jobs: the items are stored and the
            # runner's recoverer enqueues pending items, so the messages are acknowledged.
            logger.error(
                "%d messages stored but their jobs not enqueued (recover enqueues them): %s",
                len(batch.events),
                exc,
            )
            self.tally.stored += len(batch.events)
            return outcomes + [(m, Outcome.ACK) for m in batch.kept]
        self._backoff = 1.0
        new = execution.items_total if execution is not None else 0
        self.tally.stored += new
        self.tally.duplicates += len(batch.events) - new
        logger.info(
            "batch: %d messages from %s -> execution %s (%d items, %d already stored, %d dropped)",
            len(batch.messages),
            self.queue,
            execution.pk if execution is not None else "-",
            new,
            len(batch.events) - new,
            len(batch.poison),
        )
        return outcomes + [(m, Outcome.ACK) for m in batch.kept]

    def _store_one_by_one(self, batch: Batch) -> list[tuple[Message, Outcome]]:
        """Store each event on its own; one the database refuses is dropped (not requeued forever).
        If the database goes away meanwhile the rest is requeued."""
        outcomes: list[tuple[Message, Outcome]] = []
        for i, (message, event) in enumerate(zip(batch.kept, batch.events, strict=True)):
            close_old_connections()
            try:
                execution = events.events_store(
                    handler=self.handler,
                    organization_id=self.organization_id,
                    trigger="queue",
                    events=[event],
                )
            except DataError:
                logger.exception("message %s refused by the database: dropped", message.delivery_tag)
                outcomes.append((message, Outcome.DROP))
                continue
            except RedisError as exc:  # stored; the recoverer enqueues its job
                logger.error("message %s stored but its job not enqueued: %s", message.delivery_tag, exc)
                self.tally.stored += 1
            except (DatabaseError, InterfaceError) as exc:
                logger.error("storing failed, the rest requeued: %s", exc)
                return outcomes + [(m, Outcome.REQUEUE) for m in batch.kept[i:]]
            else:
                if execution is None:
                    self.tally.duplicates += 1
                else:
                    self.tally.stored += 1
            outcomes.append((message, Outcome.ACK))
        return outcomes

    def acknowledge(self, consumer: amqp.Consumer, outcomes: list[tuple[Message, Outcome]]) -> None:
        consumer.settle(outcomes)
        for _message, outcome in outcomes:
            if outcome is Outcome.DROP:
                self.tally.dropped += 1
            if outcome is not Outcome.REQUEUE:
                self.tally.handled += 1

    def _reconnect(self, consumer: amqp.Consumer, lost: amqp.ConsumerLost) -> None:
        """Reopen the connection with backoff (1 s doubling to 30 s) until `reconnect_for` runs out.

        What the lost channel held unacknowledged, the broker has requeued: it comes back, and
        what of it was already stored is recognised as such."""
        logger.error("lost the consumer of %s: %s; reconnecting", self.queue, lost)
        deadline = time.monotonic() + self.reconnect_for
        delay = 1.0
        while not self.stopping:
            self._sleep_unless_stopping(min(delay, max(0.0, deadline - time.monotonic())))
            if self.stopping:
                return
            try:
                consumer.reconnect()
            except AMQPError as exc:
                reason = f"{type(exc).__name__}: {exc}"
                if time.monotonic() >= deadline:
                    raise ConsumerGone(
                        f"cannot consume {self.queue!r} again after {self.reconnect_for:.0f} s: {reason}"
                    ) from exc
                delay = min(delay * 2, BACKOFF_MAX)
                logger.warning("reconnecting to %s failed, again in %.0f s: %s", self.queue, delay, reason)
                continue
            self.tally.reconnects += 1
            logger.warning("reconnected: consuming %s again", self.queue)
            return

    def _sleep_unless_stopping(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(min(0.2, end - time.monotonic()))
