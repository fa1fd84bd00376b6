from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import pgettext_lazy

from crm import cli, stats

# One word each: the table is read by eye and split on spaces.
HEADINGS = {
    "queue": pgettext_lazy("queue_stats column", "queue"),
    "waiting": pgettext_lazy("queue_stats column", "waiting"),
    "active": pgettext_lazy("queue_stats column", "active"),
    "failed": pgettext_lazy("queue_stats column", "failed"),
    "completed": pgettext_lazy("queue_stats column", "completed"),
    "delayed": pgettext_lazy("queue_stats column", "delayed"),
    "total": pgettext_lazy("queue_stats column", "total"),
}


class Command(cli.CrmCommand):
    help = (
        "Per-queue counts: waiting, active, failed, completed, delayed (same as GET /admin/metrics); "
        "--json adds each fair queue's tenants with work waiting under `tenants`."
    )
    needs = (cli.REDIS,)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the JSON of /admin/metrics")
        self.add_watch_argument(parser, "the counts")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["watch"] is None:
            self.stdout.write("\n".join(self._frame(as_json=options["json"], indent=2)))
            return
        self.watch(
            lambda: (self._frame(as_json=options["json"]), False),
            every=options["watch"],
            as_json=options["json"],
        )

    @staticmethod
    def _frame(*, as_json: bool, indent: int | None = None) -> list[str]:
        data = stats.queue_stats()
        if as_json:
            tenants: dict[str, Any] = {name: {**counts} for name, counts in data.items()}
            for name, summary in stats.tenant_stats().items():
                tenants[name]["tenants"] = summary
            return [json.dumps(tenants, indent=indent)]
        width = max(len(q) for q in data)
        cell = max(9, *(len(str(HEADINGS[s])) for s in stats.STATES))
        header = f"{HEADINGS['queue']!s:<{width}}  " + "  ".join(
            f"{HEADINGS[s]!s:>{cell}}" for s in stats.STATES
        )
        rule = "-" * len(header)
        lines = [header, rule]
        for queue, counts in data.items():
            lines.append(
                f"{queue:<{width}}  " + "  ".join(f"{cli.number(counts[s]):>{cell}}" for s in stats.STATES)
            )
        totals = {s: sum(c[s] for c in data.values()) for s in stats.STATES}
        lines.append(rule)
        lines.append(
            f"{HEADINGS['total']!s:<{width}}  "
            + "  ".join(f"{cli.number(totals[s]):>{cell}}" for s in stats.STATES)
        )
        return lines
