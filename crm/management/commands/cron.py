from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import pgettext_lazy

from crm import cli, cron

CHANGES = {
    "added": pgettext_lazy("cron entry", "added"),
    "updated": pgettext_lazy("cron entry", "updated"),
    "kept": pgettext_lazy("cron entry", "kept"),
    "removed": pgettext_lazy("cron entry", "removed"),
}


def change_label(change: str) -> str:
    """What `cron.cron_register` did to an entry, in the operator's language."""
    return str(CHANGES.get(change, change))


class Command(cli.CrmCommand):
    help = "List the cron table with next run times (`cron`), or run an entry now (`cron run NAME`)."
    needs = (cli.REDIS,)  # the table is code; rq-scheduler keeps the next runs in Redis

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action",
            nargs="?",
            choices=["list", "run", "register"],
            default="list",
            help="list (default): the table and next runs; run NAME: enqueue an entry now; "
            "register: make the scheduler hold exactly the table",
        )
        parser.add_argument("name", nargs="?", help="with run: the entry's name (as `cron` lists it)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "register":
            for name, change in cron.cron_register().items():
                self.stdout.write(f"{name}: {change_label(change)}")
            return
        if options["action"] == "run":
            table = cron.cron_table()
            if options["name"] not in table:
                raise CommandError(
                    (
                        _("no cron entry %(name)r (entries: %(names)s)")
                        if options["name"]
                        else _("name the entry to run (entries: %(names)s)")
                    )
                    % {"name": options["name"], "names": cli.listing(sorted(table), limit=100)}
                )
            job_id = cron.cron_fire(options["name"], manual=True)
            self.stdout.write(_("enqueued %(job_id)s") % {"job_id": job_id})
            return
        for row in cron.cron_schedule():
            when = (
                row["next_run"].strftime("%Y-%m-%d %H:%M:%S %Z") if row["next_run"] else _("not registered")
            )
            self.stdout.write(
                f"{row['name']:<28} {row['cron']:<14} {row['queue']:<24} "
                + _("next: %(when)s") % {"when": when}
            )
