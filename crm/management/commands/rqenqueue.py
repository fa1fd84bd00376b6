"""django-rq's `rqenqueue`, refusing in one line what it cannot do here: enqueue without a queue
name (there is no `default` queue)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django_rq.management.commands import rqenqueue

from crm import cli, queues


class Command(rqenqueue.Command):
    def handle(self, *args: Any, **options: Any) -> None:
        if options["queue"] not in queues.QUEUE_NAMES:
            names = cli.listing(queues.QUEUE_NAMES, limit=100)
            raise CommandError(f"name a queue with --queue ({names}); there is no {options['queue']!r} queue")
        super().handle(*args, **options)
