from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from campaigns import services
from campaigns.models import Campaign


class Command(BaseCommand):
    help = "Start a draft or scheduled campaign now (returns at once; workers do the sending)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("campaign_id", type=int)

    def handle(self, *args, **options) -> None:
        campaign = Campaign.objects.filter(pk=options["campaign_id"]).first()
        if campaign is None:
            raise CommandError(f"no campaign {options['campaign_id']}")
        try:
            services.campaign_start(campaign=campaign)
        except services.CampaignError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"campaign {campaign.pk} is {campaign.status}")
