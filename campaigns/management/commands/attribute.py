from __future__ import annotations

import sys
import time
from datetime import date, datetime
from datetime import time as day_time
from typing import Any
from zoneinfo import ZoneInfo

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from tqdm import tqdm

from campaigns import attribution
from crm import cli
from crm.models import Organization


class Command(cli.CrmCommand):
    help = (
        "Evaluate again which campaign each sale is attributed to (last campaign message within the "
        "organization's attribution window), for one organization or every one, in pages. Safe to run twice."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--organization", metavar="SLUG", help="only this organization")
        parser.add_argument(
            "--since",
            type=date.fromisoformat,
            metavar="YYYY-MM-DD",
            help="only sales sold from this day on (in the organization's time zone)",
        )
        parser.add_argument(
            "--page",
            type=int,
            default=attribution.PAGE_IDS,
            metavar="IDS",
            help=f"sale ids per statement (default {attribution.PAGE_IDS:,})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        organizations = Organization.objects.order_by("slug")
        if options["organization"]:
            organizations = organizations.filter(pk=cli.organization_or_error(options["organization"]).pk)
        for org in organizations.only("pk", "slug", "timezone"):
            since = None
            if options["since"]:
                since = datetime.combine(options["since"], day_time(0), tzinfo=ZoneInfo(org.timezone))
            began = time.monotonic()
            with tqdm(
                desc=org.slug, unit=_(" sales"), disable=None, file=sys.stderr, dynamic_ncols=True
            ) as bar:

                def expect(total: int, bar: tqdm = bar) -> None:
                    bar.reset(total=total)

                def progress(page: attribution.AttributionCounts, bar: tqdm = bar) -> None:
                    bar.update(page.sales)

                counts = attribution.organization_attribute(
                    organization_id=org.pk,
                    since=since,
                    page_ids=max(options["page"], 1),
                    expect=expect,
                    progress=progress,
                )
            self.stdout.write(
                _(
                    "%(organization)s: %(sales)s sales evaluated, %(attributed)s attributed "
                    "(%(created)s new, %(changed)s changed, %(removed)s removed) in %(seconds)ss"
                )
                % {
                    "organization": org.slug,
                    "sales": cli.number(counts.sales),
                    "attributed": cli.number(counts.attributed),
                    "created": cli.number(counts.created),
                    "changed": cli.number(counts.changed),
                    "removed": cli.number(counts.removed),
                    "seconds": cli.number(time.monotonic() - began, 1),
                }
            )
