from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from crm import cli, queues, workers


class Command(cli.CrmCommand):
    help = "Run RQ workers for every queue, in priority order, with the project's non-forking worker."
    needs = (cli.DATABASE, cli.REDIS)
    quiet_logs = False  # it runs until stopped: its logs are its output

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
        parser.add_argument(
            "--burst",
            action="store_true",
            help="exit when all queues are empty and nothing is delayed within --settle seconds",
        )
        parser.add_argument("--queues", default="", help="comma-separated queues, in the order to serve them")
        parser.add_argument(
            "--settle",
            type=float,
            default=3.0,
            help="with --burst: wait for delayed jobs due within this many seconds (default 3)",
        )

        parser.add_argument(
            "--no-recover",
            action="store_true",
            help="skip the recovery pass a long-running pool makes at start",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        unknown = [
            n.strip() for n in options["queues"].split(",") if n.strip() not in (*queues.QUEUE_NAMES, "")
        ]
        if unknown:
            raise CommandError(
                _("unknown queue %(name)r (queues: %(names)s)")
                % {"name": unknown[0], "names": cli.listing(queues.QUEUE_NAMES, limit=100)}
            )
        names = workers.parse_queue_names(options["queues"])
        if options["processes"] < 1:
            raise CommandError(_("--processes must be at least 1"))
        code = workers.run(
            names,
            burst=options["burst"],
            processes=options["processes"],
            settle=options["settle"],
            recover=not options["no_recover"],
        )
        if code:
            raise CommandError(_("a worker exited with status %(code)s") % {"code": code})
