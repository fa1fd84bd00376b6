"""django-rq's `rqresume` on the product's Redis (django-rq's looks for a `default` queue)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from rq.suspension import resume

from crm import jobs


class Command(BaseCommand):
    help = "Resume the workers suspended by rqsuspend."

    def handle(self, *args: Any, **options: Any) -> None:
        resume(jobs.get_connection())
