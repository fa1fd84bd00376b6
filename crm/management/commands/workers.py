from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from crm import workers


class Command(BaseCommand):
    help = "Run RQ workers for every queue, in priority order, with the project's non-forking worker."

    def add_arguments(self, parser) -> None:
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

    def handle(self, *args, **options) -> None:
        try:
            names = workers.parse_queue_names(options["queues"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["processes"] < 1:
            raise CommandError("--processes must be at least 1")
        code = workers.run(
            names,
            burst=options["burst"],
            processes=options["processes"],
            settle=options["settle"],
            recover=not options["no_recover"],
        )
        if code:
            raise CommandError(f"a worker exited with status {code}")
