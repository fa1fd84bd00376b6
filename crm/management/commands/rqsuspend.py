"""django-rq's `rqsuspend` on the product's Redis (django-rq's looks for a `default` queue)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from rq.suspension import suspend

from crm import cli, jobs


class Command(cli.CrmCommand):
    help = "Suspend the workers: no new job starts until rqresume (or --duration runs out)."
    needs = (cli.REDIS,)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--duration", "-d", type=int, help="seconds to suspend the workers (default: until rqresume)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        duration = options.get("duration")
        if duration is not None and duration < 1:
            raise CommandError("--duration must be at least 1 second")
        suspend(jobs.get_connection(), duration or None)
        self.stdout.write(
            "workers suspended" + (f" for {duration} s" if duration else "; rqresume resumes them")
        )
