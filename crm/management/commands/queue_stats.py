from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from crm import stats


class Command(BaseCommand):
    help = "Per-queue counts: waiting, active, failed, completed, delayed (same as GET /admin/metrics)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="print the JSON of /admin/metrics")

    def handle(self, *args, **options) -> None:
        data = stats.queue_stats()
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2))
            return
        width = max(len(q) for q in data)
        header = f"{'queue':<{width}}  " + "  ".join(f"{s:>9}" for s in stats.STATES)
        self.stdout.write(header)
        self.stdout.write("-" * len(header))
        for queue, counts in data.items():
            self.stdout.write(f"{queue:<{width}}  " + "  ".join(f"{counts[s]:>9}" for s in stats.STATES))
        totals = {s: sum(c[s] for c in data.values()) for s in stats.STATES}
        self.stdout.write("-" * len(header))
        self.stdout.write(f"{'total':<{width}}  " + "  ".join(f"{totals[s]:>9}" for s in stats.STATES))
