from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from campaigns.models import Campaign
from crm.models import Organization
from crm.services import DEMO_SLUG


class Command(BaseCommand):
    help = "Create (not start) a campaign for the demo organization's whole audience; prints its id."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--channel", choices=["whatsapp"], default="whatsapp")
        parser.add_argument("--name", default="Campanha demo")

    def handle(self, *args, **options) -> None:
        org = Organization.objects.filter(slug=DEMO_SLUG).first()
        if org is None:
            raise CommandError("no demo organization: run `manage.py demo --graph-url URL` first")
        number = org.whatsapp_numbers.first()
        if number is None:
            raise CommandError(
                "the demo organization has no WhatsApp number: run `manage.py demo --graph-url URL`"
            )
        campaign = Campaign.objects.create(
            organization=org,
            name=options["name"],
            channel=options["channel"],
            whatsapp_number=number,
            template_name="promo_demo",
            template_language="pt_BR",
            template_variables=["first_name"],
            redirect_url="https://example.com.br/ofertas",
            redirect_button_index=0,
            unsubscribe_button_index=1,
        )
        self.stdout.write(str(campaign.pk))
