"""django-rq's `rqworker`, on the product's terms: without queue names it listens on every product
queue (in `manage.py workers`' order, not on a `default` queue that does not exist), and the
worker (crm.worker.Worker) always reads the product's JSON jobs, whatever `--serializer` says."""

from __future__ import annotations

from typing import Any

from django_rq.management.commands import rqworker

from crm import cli, workers


class Command(cli.CrmCommand, rqworker.Command):
    help = "An RQ worker (crm.worker.Worker) on the named queues, or on every product queue."
    needs = (cli.DATABASE, cli.REDIS)
    quiet_logs = False  # it runs until stopped: its logs are its output

    def handle(self, *args: Any, **options: Any) -> None:
        super().handle(*(args or workers.parse_queue_names(None)), **options)
