from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from campaigns import services
from campaigns.management.commands._campaign import campaign_or_error


class Command(BaseCommand):
    help = "Start a draft or scheduled campaign now (returns at once; workers do the sending)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("campaign_id", type=int)

    def handle(self, *args, **options) -> None:
        campaign = campaign_or_error(options["campaign_id"])
        try:
            services.campaign_start(campaign=campaign)
        except services.CampaignError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"campaign {campaign.pk} is {campaign.status}")
