from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from campaigns.models import Campaign
from crm import cli
from project.demo_lift import demo_campaign_sales


class Command(cli.CrmCommand):
    help = (
        "Demo: the sales of a sent campaign's customers in its window, the treated ones buying a little "
        "more (a true uplift), so its lift report means something. Prints how many sales."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("campaign_id", type=int, help="the campaign's id")
        parser.add_argument(
            "--base-rate", type=float, default=0.05, help="the control group's buyers rate (0.05)"
        )
        parser.add_argument(
            "--uplift", type=float, default=0.3, help="the treated's relative uplift (0.3 = +30%%)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        campaign = Campaign.objects.filter(pk=options["campaign_id"]).select_related("organization").first()
        if campaign is None:
            raise CommandError(_("no campaign %(id)s") % {"id": options["campaign_id"]})
        written = demo_campaign_sales(
            campaign=campaign, base_rate=options["base_rate"], uplift=options["uplift"]
        )
        self.stdout.write(str(written))
