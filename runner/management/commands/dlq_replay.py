from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runner import services
from runner.models import Execution


class Command(BaseCommand):
    help = "Replay DLQ items (a new attempt each) of a handler (integration_key/handler_key) or an execution."

    def add_arguments(self, parser: Any) -> None:
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--handler", help="integration_key/handler_key")
        group.add_argument("--execution", type=int, help="execution id")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["handler"]:
            ik, _, hk = options["handler"].partition("/")
            try:
                handler = services.handler_get(integration_key=ik, handler_key=hk)
            except Exception as exc:
                raise CommandError(f"no handler {options['handler']!r}") from exc
            ids = services.dlq_items(handler=handler)
        else:
            execution = Execution.objects.filter(pk=options["execution"]).first()
            if execution is None:
                raise CommandError(f"no execution {options['execution']}")
            ids = services.dlq_items(execution=execution)
        n = services.items_replay(item_ids=ids)
        self.stdout.write(f"replayed {n} item(s)")
