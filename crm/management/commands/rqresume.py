"""django-rq's `rqresume` on the product's Redis (django-rq's looks for a `default` queue)."""

from __future__ import annotations

from typing import Any

from rq.suspension import resume

from crm import cli, jobs


class Command(cli.CrmCommand):
    help = "Resume the workers suspended by rqsuspend."
    needs = (cli.REDIS,)

    def handle(self, *args: Any, **options: Any) -> None:
        resume(jobs.get_connection())
