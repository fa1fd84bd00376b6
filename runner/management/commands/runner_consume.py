"""The runner's queue trigger: read an AMQP queue and store its messages as items (priority 3).

A message is acknowledged only after `services.events_store` returned, i.e. after its item is
committed: a consumer killed at any point leaves its unacknowledged messages to be redelivered.
A message's AMQP message_id is recorded with its item, so a redelivery of a stored message (the
consumer died between storing and acknowledging it) or a publisher's resend is acknowledged without
being stored again.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError, DataError, InterfaceError, close_old_connections
from django.utils.translation import gettext as _
from redis.exceptions import RedisError

from crm import cli
from integrations.runner import amqp
from runner import services
from runner.management.commands._handler import handler_or_error, organization_id_for
from runner.models import Handler

logger = logging.getLogger("runner.consume")

# Test-only hook: seconds to wait after a batch is received and before it is stored, so a test
# can kill the consumer in that gap deterministically. Never set it in production.
PAUSE_ENV = "CRM_TEST_CONSUME_PAUSE_BEFORE_STORE"
# The same, after a batch is stored and before it is acknowledged.
ACK_PAUSE_ENV = "CRM_TEST_CONSUME_PAUSE_BEFORE_ACK"
BACKOFF_MAX = 30.0


def event_of(message: amqp.Message) -> dict[str, Any] | None:
    """The event a message carries ({"external_id", "payload", "event_id"}), or None if its body is
    not JSON. The item's external id is the message_id, else the body's `id`; only the message_id
    recognises a redelivery (a body's `id` usually names a record, which may change again)."""
    try:
        payload = json.loads(message.body)
    except ValueError:  # UnicodeDecodeError included
        return None
    external_id = str(message.message_id or (payload.get("id") if isinstance(payload, dict) else "") or "")
    return {"external_id": external_id, "payload": payload, "event_id": message.message_id}


class Command(cli.CrmCommand):
    help = (
        "Consume an AMQP queue into items of queue-triggered executions (priority 3); "
        "acknowledges messages only after they are stored."
    )
    # PostgreSQL is checked at start (once running, an outage requeues the batch and backs off).
    # Redis is not: items stored while it is down are enqueued by the runner's recoverer.
    needs = (cli.DATABASE,)
    quiet_logs = False  # it runs until stopped: its logs are its output

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("integration_key", help="the integration type's key")
        parser.add_argument("handler_key", help="the handler's key within that integration")
        parser.add_argument("--org", help="organization slug (default: the handler's organization)")
        parser.add_argument("--amqp-url", default=None, help="broker URL (default: the AMQP_URL setting)")
        parser.add_argument("--queue", help="queue name (default: runner.<integration_key>.<handler_key>)")
        parser.add_argument("--prefetch", type=int, default=100, help="unacknowledged messages held at most")
        parser.add_argument("--batch", type=int, default=100, help="messages stored per execution at most")
        parser.add_argument("--max-messages", type=int, default=0, help="exit after this many (0: never)")
        parser.add_argument(
            "--idle-exit", type=float, default=0, help="exit after this many seconds without a message"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        handler = handler_or_error(options["integration_key"], options["handler_key"])
        org_id = organization_id_for(handler, options["org"])
        batch_size = max(1, options["batch"])
        max_messages = max(0, options["max_messages"])
        idle_exit = max(0.0, options["idle_exit"])
        queue = options["queue"] or f"runner.{handler.integration.integration_key}.{handler.handler_key}"
        url = options["amqp_url"] or getattr(settings, "AMQP_URL", amqp.DEFAULT_URL)
        pause = float(os.environ.get(PAUSE_ENV) or 0)
        ack_pause = float(os.environ.get(ACK_PAUSE_ENV) or 0)

        stopping = False

        def _stop(signum: int, _frame: Any) -> None:
            nonlocal stopping
            stopping = True
            logger.info("signal %s: finishing the current batch, then stopping", signum)

        previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            consumer = amqp.Consumer(url, queue, prefetch=options["prefetch"])
        except Exception as exc:
            raise CommandError(
                _("cannot consume %(queue)r: %(error)s") % {"queue": queue, "error": exc}
            ) from exc
        logger.info("consuming %s into %s (organization %s)", queue, handler, org_id)
        handled = stored = dropped = duplicates = 0
        last_message = time.monotonic()
        backoff = 1.0
        try:
            while not stopping:
                want = batch_size if not max_messages else min(batch_size, max_messages - handled)
                if want <= 0:
                    break
                messages = consumer.fetch(want)
                if not messages:
                    if idle_exit and time.monotonic() - last_message >= idle_exit:
                        logger.info("idle for %.1f s: exiting", idle_exit)
                        break
                    continue
                last_message = time.monotonic()
                if pause:
                    logger.warning(
                        "test hook %s: %d messages received, storing in %.1f s",
                        PAUSE_ENV,
                        len(messages),
                        pause,
                    )
                    time.sleep(pause)
                events: list[dict[str, Any]] = []
                kept_messages: list[amqp.Message] = []
                for message in messages:
                    event = event_of(message)
                    if event is None:
                        logger.warning(
                            "message %s on %s is not JSON: dropped (%r)",
                            message.message_id or message.delivery_tag,
                            queue,
                            message.body[:80],
                        )
                        consumer.drop(message.delivery_tag)
                        dropped += 1
                    else:
                        events.append(event)
                        kept_messages.append(message)
                if not events:
                    handled += len(messages)
                    continue
                close_old_connections()
                try:
                    execution = services.events_store(
                        handler=handler, organization_id=org_id, trigger="queue", events=events
                    )
                except DataError:
                    # The data itself is refused (e.g. a NUL character jsonb rejects): isolate it.
                    logger.exception("storing %d messages failed: storing them one by one", len(events))
                    kept, refused = self._one_by_one(consumer, handler, org_id, kept_messages, events)
                    handled += len(messages)
                    stored += kept
                    dropped += refused
                    continue
                except (DatabaseError, InterfaceError) as exc:
                    # Not stored (database down, schema not migrated…): everything goes back to the queue.
                    consumer.requeue_through(messages[-1].delivery_tag)
                    logger.error(
                        "storing %d messages failed, requeued; retry in %.0f s: %s", len(events), backoff, exc
                    )
                    consumer.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                except RedisError as exc:
                    # events_store commits before it enqueues the item jobs: the items are stored and
                    # the runner's recoverer enqueues pending items, so the messages are acknowledged.
                    consumer.ack_through(messages[-1].delivery_tag)
                    logger.error(
                        "%d messages stored but their jobs not enqueued (recover enqueues them): %s",
                        len(events),
                        exc,
                    )
                    handled += len(messages)
                    stored += len(events)
                    continue
                if ack_pause:
                    logger.warning("test hook %s: stored, acknowledging in %.1f s", ACK_PAUSE_ENV, ack_pause)
                    time.sleep(ack_pause)
                consumer.ack_through(messages[-1].delivery_tag)
                backoff = 1.0
                handled += len(messages)
                new = execution.items_total if execution is not None else 0
                stored += new
                duplicates += len(events) - new
                logger.info(
                    "batch: %d messages from %s -> execution %s (%d items, %d already stored, %d dropped)",
                    len(messages),
                    queue,
                    execution.pk if execution is not None else "-",
                    new,
                    len(events) - new,
                    len(messages) - len(events),
                )
        finally:
            consumer.close()
            for sig, old in previous.items():
                signal.signal(sig, old)
        logger.info(
            "stopped: %d messages handled, %d stored, %d dropped, %d already stored",
            handled,
            stored,
            dropped,
            duplicates,
        )
        self.stdout.write(
            _("%(stored)s stored, %(dropped)s dropped, %(duplicates)s already stored")
            % {
                "stored": cli.number(stored),
                "dropped": cli.number(dropped),
                "duplicates": cli.number(duplicates),
            }
        )

    def _one_by_one(
        self,
        consumer: amqp.Consumer,
        handler: Handler,
        org_id: int,
        messages: list[amqp.Message],
        events: list[dict[str, Any]],
    ) -> tuple[int, int]:
        """Store each event on its own; one the database refuses is dropped (not requeued forever).

        Returns (stored, dropped); if the database goes away meanwhile the rest is requeued.
        """
        kept = refused = 0
        for message, event in zip(messages, events, strict=True):
            close_old_connections()
            try:
                services.events_store(
                    handler=handler, organization_id=org_id, trigger="queue", events=[event]
                )
            except DataError:
                logger.exception("message %s refused by the database: dropped", message.delivery_tag)
                consumer.drop(message.delivery_tag)
                refused += 1
                continue
            except RedisError as exc:  # stored; the recoverer enqueues its job
                logger.error("message %s stored but its job not enqueued: %s", message.delivery_tag, exc)
            except (DatabaseError, InterfaceError) as exc:
                consumer.requeue_through(messages[-1].delivery_tag)
                logger.error("storing failed, the rest requeued: %s", exc)
                break
            consumer.ack_through(message.delivery_tag)
            kept += 1
        return kept, refused
