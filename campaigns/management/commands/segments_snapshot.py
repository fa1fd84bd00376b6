from __future__ import annotations

import argparse
import time
from datetime import date
from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from tqdm import tqdm

from campaigns import segments
from crm import cli
from crm.models import Organization


def _day(text: str) -> date:
    try:
        return segments.snapshot_day(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Command(cli.CrmCommand):
    help = (
        "Compute (or recompute: the day's rows are replaced) the RFM segment snapshot of every "
        "organization with sales, or of one; then prune snapshots older than SEGMENT_KEEP_DAYS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--date",
            type=_day,
            metavar="YYYY-MM-DD",
            help="the day (default: yesterday, the last complete day, in each organization's time zone)",
        )
        parser.add_argument("--org", metavar="SLUG", help="only this organization")

    def handle(self, *args: Any, **options: Any) -> None:
        organizations = segments.organizations_with_sales()
        if options["org"]:
            org = cli.organization_or_error(options["org"])
            organizations = Organization.objects.filter(pk=org.pk)
        started = time.monotonic()
        done = customers = 0
        for org in tqdm(
            list(organizations.only("pk", "slug", "timezone")), unit=_(" organizations"), disable=None
        ):
            day = options["date"] or segments.default_day(org.timezone)
            began = time.monotonic()
            counts = segments.segments_snapshot(organization_id=org.pk, day=day)
            segments.segments_prune(organization_id=org.pk)
            with tqdm.external_write_mode():
                self.stdout.write(segments.snapshot_summary(org.slug, day, counts, time.monotonic() - began))
            done += 1
            customers += sum(counts.values())
        self.stdout.write(
            ngettext(
                "total: %(count)s organization, %(customers)s customers in %(seconds)ss",
                "total: %(count)s organizations, %(customers)s customers in %(seconds)ss",
                done,
            )
            % {
                "count": cli.number(done),
                "customers": cli.number(customers),
                "seconds": cli.number(time.monotonic() - started, 1),
            }
        )
