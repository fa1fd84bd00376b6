from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from tqdm import tqdm

from crm import cli
from runner import operator
from runner.management.commands._handler import handler_or_error
from runner.models import Execution


class Command(cli.CrmCommand):
    help = "Replay DLQ items (a new attempt each) of a handler (integration_key/handler_key) or an execution."
    needs = (cli.DATABASE, cli.REDIS)  # it puts items back, then enqueues them

    def add_arguments(self, parser: CommandParser) -> None:
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument(
            "--handler", metavar="INTEGRATION_KEY/HANDLER_KEY", help="every DLQ item of this handler"
        )
        group.add_argument("--execution", type=int, metavar="ID", help="the DLQ items of this execution")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["handler"]:
            ik, slash, hk = options["handler"].partition("/")
            if not slash:
                raise CommandError(
                    _("--handler %(value)r: expected INTEGRATION_KEY/HANDLER_KEY")
                    % {"value": options["handler"]}
                )
            ids = operator.dlq_items(handler=handler_or_error(ik, hk))
        else:
            execution = Execution.objects.filter(pk=options["execution"]).first()
            if execution is None:
                raise CommandError(_("no execution %(id)s") % {"id": options["execution"]})
            ids = operator.dlq_items(execution=execution)
        with tqdm(total=len(ids), unit=_(" items"), disable=None, file=sys.stderr, dynamic_ncols=True) as bar:
            n = operator.items_replay(item_ids=ids, progress=bar.update)
        self.stdout.write(
            ngettext("replayed %(count)s item", "replayed %(count)s items", n) % {"count": cli.number(n)}
        )
