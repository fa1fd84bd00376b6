from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from campaigns import lifecycle
from campaigns.management.commands._campaign import campaign_or_error
from crm import cli


class Command(cli.CrmCommand):
    help = "Start a draft or scheduled campaign now (returns at once; workers do the sending)."
    needs = (cli.DATABASE, cli.REDIS)  # it writes, then enqueues the fan-out: Redis must answer first

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("campaign_id", type=int, help="the campaign's id (demo_campaign prints it)")

    def handle(self, *args: Any, **options: Any) -> None:
        campaign = campaign_or_error(options["campaign_id"])
        try:
            lifecycle.campaign_start(campaign=campaign)
        except lifecycle.CampaignError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            _("campaign %(id)s is %(status)s") % {"id": campaign.pk, "status": campaign.get_status_display()}
        )
