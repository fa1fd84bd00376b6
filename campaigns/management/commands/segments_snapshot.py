from __future__ import annotations

import time
from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, no_translations
from tqdm import tqdm

from campaigns import segments
from crm.models import Organization


class Command(BaseCommand):
    help = (
        "Compute (or recompute: the day's rows are replaced) the RFM segment snapshot of every "
        "organization with sales, or of one; then prune snapshots older than SEGMENT_KEEP_DAYS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--date",
            type=date.fromisoformat,
            metavar="YYYY-MM-DD",
            help="the day (default: yesterday, the last complete day, in each organization's time zone)",
        )
        parser.add_argument("--org", metavar="SLUG", help="only this organization")

    @no_translations  # terminal output is an interface operators' scripts read: always English
    def handle(self, *args: Any, **options: Any) -> None:
        organizations = segments.organizations_with_sales()
        if options["org"]:
            organizations = Organization.objects.filter(slug=options["org"])
            if not organizations.exists():
                raise CommandError(f"no organization with slug {options['org']!r}")
        started = time.monotonic()
        done = customers = 0
        for org in tqdm(list(organizations.only("pk", "slug", "timezone")), unit="org", disable=None):
            day = options["date"] or segments.default_day(org.timezone)
            began = time.monotonic()
            counts = segments.segments_snapshot(organization_id=org.pk, day=day)
            segments.segments_prune(organization_id=org.pk)
            with tqdm.external_write_mode():
                self.stdout.write(segments.snapshot_summary(org.slug, day, counts, time.monotonic() - began))
            done += 1
            customers += sum(counts.values())
        self.stdout.write(
            f"total: {done:,} organization{'' if done == 1 else 's'}, {customers:,} customers "
            f"in {time.monotonic() - started:.1f}s"
        )
