from __future__ import annotations

from django.core.management.base import BaseCommand

from crm import recovery


class Command(BaseCommand):
    help = "Re-enqueue every piece of unfinished work the database knows and Redis no longer holds."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="count, enqueue nothing")

    def handle(self, *args, **options) -> None:
        result = recovery.recover(dry_run=options["dry_run"])
        verb = "would re-enqueue" if options["dry_run"] else "re-enqueued"
        for name, count in result.items():
            self.stdout.write(f"{name}: {verb} {count}")
        self.stdout.write(f"total: {verb} {sum(result.values())}")
