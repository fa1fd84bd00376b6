"""django-rq's `rqsuspend` on the product's Redis (django-rq's looks for a `default` queue)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django_rq.management.commands import rqsuspend
from rq.suspension import suspend

from crm import jobs


class Command(rqsuspend.Command):
    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        duration = options.get("duration")
        if duration is not None and duration < 1:
            raise CommandError("--duration must be at least 1 second")
        suspend(jobs.get_connection(), duration or None)
        self.stdout.write(
            "workers suspended" + (f" for {duration} s" if duration else "; rqresume resumes them")
        )
