from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from crm import cli, cron, recovery
from crm.management.commands.cron import change_label


class Command(cli.CrmCommand):
    help = (
        "Run the cron scheduler (rq-scheduler): registers the cron table idempotently, runs the "
        "recovery pass, then fires entries on time. Run one or more; only one fires at a time."
    )
    needs = (cli.DATABASE, cli.REDIS)
    quiet_logs = False  # it runs until stopped: its logs are its output

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=int, default=5, help="seconds between checks (default 5)")
        parser.add_argument("--burst", action="store_true", help="register, fire what is due once, exit")

    def handle(self, *args: Any, **options: Any) -> None:
        scheduler = cron.get_scheduler(interval=options["interval"])
        for name, change in cron.cron_register(scheduler).items():
            self.stdout.write(_("cron %(name)s: %(change)s") % {"name": name, "change": change_label(change)})
        for name, count in recovery.recover().items():
            if count:
                self.stdout.write(
                    ngettext(
                        "recovery %(name)s: re-enqueued %(count)s",
                        "recovery %(name)s: re-enqueued %(count)s",
                        count,
                    )
                    % {"name": name, "count": cli.number(count)}
                )
        self.stdout.write(_("scheduler running (every %(seconds)ss)") % {"seconds": options["interval"]})
        scheduler.run(burst=options["burst"])
