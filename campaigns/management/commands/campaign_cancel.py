from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from campaigns import lifecycle
from campaigns.management.commands._campaign import campaign_or_error
from crm import cli


class Command(cli.CrmCommand):
    help = "Cancel a campaign: messages not yet sent never will be."
    needs = (cli.DATABASE, cli.REDIS)  # it also removes a scheduled start from Redis

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("campaign_id", type=int, help="the campaign's id")

    def handle(self, *args: Any, **options: Any) -> None:
        campaign = campaign_or_error(options["campaign_id"])
        try:
            cancelled = lifecycle.campaign_cancel(campaign=campaign)
        except lifecycle.CampaignError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            _("campaign %(id)s cancelled; %(count)s queued messages will not be sent")
            % {"id": campaign.pk, "count": cli.number(cancelled)}
        )
