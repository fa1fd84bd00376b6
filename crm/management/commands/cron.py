from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from crm import cron


class Command(BaseCommand):
    help = "List the cron table with next run times (`cron`), or run an entry now (`cron run NAME`)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", nargs="?", choices=["list", "run", "register"], default="list")
        parser.add_argument("name", nargs="?")

    def handle(self, *args, **options) -> None:
        if options["action"] == "register":
            for name, change in cron.cron_register().items():
                self.stdout.write(f"{name}: {change}")
            return
        if options["action"] == "run":
            if options["name"] not in cron.cron_table():
                raise CommandError(f"no cron entry {options['name']!r}; see `manage.py cron`")
            job_id = cron.cron_fire(options["name"], manual=True)
            self.stdout.write(f"enqueued {job_id}")
            return
        for row in cron.cron_schedule():
            when = row["next_run"].strftime("%Y-%m-%d %H:%M:%S %Z") if row["next_run"] else "not registered"
            self.stdout.write(f"{row['name']:<28} {row['cron']:<14} {row['queue']:<24} next: {when}")
