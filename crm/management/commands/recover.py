from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from tqdm import tqdm

from crm import cli, recovery


class Command(cli.CrmCommand):
    help = "Re-enqueue every piece of unfinished work the database knows and Redis no longer holds."
    needs = (cli.DATABASE, cli.REDIS)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="count, enqueue nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run = options["dry_run"]
        with tqdm(
            desc=_("checking"), unit=_(" jobs"), disable=None, file=sys.stderr, dynamic_ncols=True
        ) as bar:

            def progress(recoverer: str, checked: int) -> None:
                bar.set_postfix_str(recoverer, refresh=False)
                bar.update(checked)

            result = recovery.recover(dry_run=dry_run, progress=progress)
        for name, count in [*result.items(), (_("total"), sum(result.values()))]:
            verb = (
                ngettext("would re-enqueue %(count)s", "would re-enqueue %(count)s", count)
                if dry_run
                else ngettext("re-enqueued %(count)s", "re-enqueued %(count)s", count)
            )
            self.stdout.write(f"{name}: " + verb % {"count": cli.number(count)})
