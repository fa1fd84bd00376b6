from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from crm import cli
from runner import executions
from runner.management.commands._handler import handler_or_error, organization_id_for


class Command(cli.CrmCommand):
    help = "Start a manual run of a handler (its RunJob produces and fans out the items); prints its id."
    needs = (cli.DATABASE, cli.REDIS)  # it records the execution, then enqueues its RunJob

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("integration_key", help="the integration type's key (e.g. crm-x)")
        parser.add_argument("handler_key", help="the handler's key within that integration")
        parser.add_argument("--org", help="organization slug (default: the handler's organization)")

    def handle(self, *args: Any, **options: Any) -> None:
        handler = handler_or_error(options["integration_key"], options["handler_key"])
        org_id = organization_id_for(handler, options["org"])
        execution = executions.execution_start(handler=handler, organization_id=org_id, trigger="manual")
        self.stdout.write(str(execution.pk))
