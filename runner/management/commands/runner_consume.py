"""The runner's queue trigger: read an AMQP queue and store its messages as items (priority 3).

The loop is `runner.consumer.BatchConsumer`; this command parses the options, names the handler
and organization, turns SIGTERM/SIGINT into "finish the batch in hand, then stop", and exits
non-zero when the broker cannot be reached (at the start, or again after `--reconnect-for`).
"""

from __future__ import annotations

import logging
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from pika.exceptions import AMQPError

from crm.models import Organization
from integrations.runner import amqp
from runner import services
from runner.consumer import BatchConsumer, ConsumerGone
from runner.models import Handler

logger = logging.getLogger("runner.consume")


class Command(BaseCommand):
    help = (
        "Consume an AMQP queue into items of queue-triggered executions (priority 3); "
        "acknowledges messages only after they are stored."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("integration_key")
        parser.add_argument("handler_key")
        parser.add_argument("--org", help="organization slug (default: the handler's organization)")
        parser.add_argument("--amqp-url", default=None, help="broker URL (default: the AMQP_URL setting)")
        parser.add_argument("--queue", help="queue name (default: runner.<integration_key>.<handler_key>)")
        parser.add_argument("--prefetch", type=int, default=100, help="unacknowledged messages held at most")
        parser.add_argument("--batch", type=int, default=100, help="messages stored per execution at most")
        parser.add_argument("--max-messages", type=int, default=0, help="exit after this many (0: never)")
        parser.add_argument(
            "--idle-exit", type=float, default=0, help="exit after this many seconds without a message"
        )
        parser.add_argument(
            "--reconnect-for",
            type=float,
            default=300,
            help="seconds to keep reconnecting to a lost broker before exiting non-zero",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            handler = services.handler_get(
                integration_key=options["integration_key"], handler_key=options["handler_key"]
            )
        except Handler.DoesNotExist:
            raise CommandError("no such handler") from None
        queue = options["queue"] or f"runner.{handler.integration.integration_key}.{handler.handler_key}"
        loop = BatchConsumer(
            handler=handler,
            organization_id=self._organization_id(handler, options["org"]),
            url=options["amqp_url"] or getattr(settings, "AMQP_URL", amqp.DEFAULT_URL),
            queue=queue,
            prefetch=options["prefetch"],
            batch=options["batch"],
            max_messages=options["max_messages"],
            idle_exit=options["idle_exit"],
            reconnect_for=options["reconnect_for"],
        )

        def _stop(signum: int, _frame: Any) -> None:
            loop.stop()
            logger.info("signal %s: finishing the current batch, then stopping", signum)

        previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
        logger.info("consuming %s into %s (organization %s)", queue, handler, loop.organization_id)
        try:
            tally = loop.run()
        except AMQPError as exc:
            raise CommandError(f"cannot consume {queue!r}: {type(exc).__name__}: {exc}") from exc
        except ConsumerGone as exc:
            logger.error("giving up: %s", exc)
            raise CommandError(str(exc)) from exc
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
        logger.info(
            "stopped: %d messages handled, %d stored, %d dropped, %d already stored",
            tally.handled,
            tally.stored,
            tally.dropped,
            tally.duplicates,
        )
        self.stdout.write(
            f"{tally.stored} stored, {tally.dropped} dropped, {tally.duplicates} already stored"
        )

    def _organization_id(self, handler: Handler, slug: str | None) -> int:
        if slug:
            org_id = Organization.objects.filter(slug=slug).values_list("id", flat=True).first()
            if org_id is None:
                raise CommandError(f"no organization {slug!r}")
            return org_id
        if handler.organization_id:
            return handler.organization_id
        raise CommandError("the handler serves every organization: name one with --org SLUG")
