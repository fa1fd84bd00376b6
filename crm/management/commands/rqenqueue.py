"""django-rq's `rqenqueue`, refusing in one line what it cannot do here: enqueue without a queue
name (there is no `default` queue)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django_rq.management.commands import rqenqueue

from crm import cli, queues


class Command(cli.CrmCommand, rqenqueue.Command):
    help = (
        "Enqueue a function call on a named queue (JSON arguments only): rqenqueue --queue NAME FUNC ARG..."
    )
    needs = (cli.REDIS,)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue", "-q", default="default", help="the queue (required: there is no default)"
        )
        parser.add_argument("--timeout", "-t", type=int, help="the job's timeout in seconds")
        parser.add_argument(
            "args", nargs="*", help="the function's dotted path, then its positional arguments"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["queue"] not in queues.QUEUE_NAMES:
            names = cli.listing(queues.QUEUE_NAMES, limit=100)
            raise CommandError(f"name a queue with --queue ({names}); there is no {options['queue']!r} queue")
        super().handle(*args, **options)
