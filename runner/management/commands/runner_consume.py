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
from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _
from pika.exceptions import AMQPError

from crm import cli
from integrations.runner import amqp
from runner.consumer import BatchConsumer, ConsumerGone
from runner.management.commands._handler import handler_or_error, organization_id_for

logger = logging.getLogger("runner.consume")


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
        parser.add_argument(
            "--reconnect-for",
            type=float,
            default=300,
            help="seconds to keep reconnecting to a lost broker before exiting non-zero",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        handler = handler_or_error(options["integration_key"], options["handler_key"])
        queue = options["queue"] or f"runner.{handler.integration.integration_key}.{handler.handler_key}"
        loop = BatchConsumer(
            handler=handler,
            organization_id=organization_id_for(handler, options["org"]),
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
            said = {"queue": queue, "error": f"{type(exc).__name__}: {exc}"}
            raise CommandError(_("cannot consume %(queue)r: %(error)s") % said) from exc
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
            _("%(stored)s stored, %(dropped)s dropped, %(duplicates)s already stored")
            % {
                "stored": cli.number(tally.stored),
                "dropped": cli.number(tally.dropped),
                "duplicates": cli.number(tally.duplicates),
            }
        )
