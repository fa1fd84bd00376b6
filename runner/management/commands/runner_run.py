from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from crm.models import Organization
from runner import services
from runner.models import Handler


class Command(BaseCommand):
    help = "Start a manual run of a handler (its RunJob produces and fans out the items); prints its id."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("integration_key")
        parser.add_argument("handler_key")
        parser.add_argument("--org", help="organization slug (default: the handler's organization)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            handler = services.handler_get(
                integration_key=options["integration_key"], handler_key=options["handler_key"]
            )
        except Handler.DoesNotExist:
            raise CommandError("no such handler") from None
        if options["org"]:
            org_id = Organization.objects.filter(slug=options["org"]).values_list("id", flat=True).first()
            if org_id is None:
                raise CommandError(f"no organization {options['org']!r}")
        elif handler.organization_id:
            org_id = handler.organization_id
        else:
            raise CommandError("the handler serves every organization: name one with --org SLUG")
        execution = services.execution_start(handler=handler, organization_id=org_id, trigger="manual")
        self.stdout.write(str(execution.pk))
