from __future__ import annotations

from django.core.management.base import BaseCommand

from crm import cron, recovery


class Command(BaseCommand):
    help = (
        "Run the cron scheduler (rq-scheduler): registers the cron table idempotently, runs the "
        "recovery pass, then fires entries on time. Run one or more; only one fires at a time."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--interval", type=int, default=5, help="seconds between checks (default 5)")
        parser.add_argument("--burst", action="store_true", help="register, fire what is due once, exit")

    def handle(self, *args, **options) -> None:
        scheduler = cron.get_scheduler(interval=options["interval"])
        for name, change in cron.cron_register(scheduler).items():
            self.stdout.write(f"cron {name}: {change}")
        for name, count in recovery.recover().items():
            if count:
                self.stdout.write(f"recovery {name}: re-enqueued {count}")
        self.stdout.write(f"scheduler running (every {options['interval']}s)")
        scheduler.run(burst=options["burst"])
