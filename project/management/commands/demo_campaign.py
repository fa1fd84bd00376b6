from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from campaigns.models import BodyFormat, Campaign, Channel, Sender
from crm import cli
from crm.models import Organization
from project.demo.crm import DEMO_SLUG
from project.demo.integrations import DEMO_PHONE_NUMBER_ID

DEMO_EMAIL_SUBJECT = "{{ first_name }}, ofertas da semana na {{ store_name }}"
DEMO_EMAIL_BODY = """<mjml>
  <mj-head>
    <mj-title>Ofertas da semana</mj-title>
    <mj-preview>Até 40% de desconto só esta semana</mj-preview>
  </mj-head>
  <mj-body background-color="#f4f4f4">
    <mj-section background-color="#ffffff">
      <mj-column>
        <mj-text font-size="20px" font-family="Helvetica, Arial, sans-serif">Olá, {{ first_name }}!</mj-text>
        <mj-text font-family="Helvetica, Arial, sans-serif">
          Separamos ofertas de até 40% para você na {{ store_name }}.
        </mj-text>
        <mj-button background-color="#0b7a3e" href="https://example.com.br/ofertas">Ver ofertas</mj-button>
        <mj-text font-size="11px" color="#777777" font-family="Helvetica, Arial, sans-serif">
          Não quer mais receber nossos e-mails? <a href="{{ unsubscribe_url }}">Descadastre-se</a>.
        </mj-text>
      </mj-column>
    </mj-section>
  </mj-body>
</mjml>
"""


class Command(cli.CrmCommand):
    help = "Create (not start) a campaign for the demo organization's whole audience; prints its id."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--channel",
            choices=[c.value for c in Channel],
            default=Channel.WHATSAPP,
            help="whatsapp (default) or email",
        )
        parser.add_argument(
            "--name", default="Campanha demo", help="the campaign's name (default: Campanha demo)"
        )
        parser.add_argument(
            "--sender",
            choices=[s.value for s in Sender],
            default=Sender.CAMPAIGN,
            help="WhatsApp: send from the campaign's number (default) or from each customer's store "
            "number (the store of their latest sale)",
        )
        parser.add_argument(
            "--control-percent",
            type=int,
            default=0,
            help="hold out this share of the recipients (0-50) for the lift report; after the send, "
            "`manage.py demo_campaign_sales ID` writes the window's sales",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        org = Organization.objects.filter(slug=DEMO_SLUG).first()
        if org is None:
            raise CommandError(_("no demo organization: run `manage.py demo` first"))
        if options["channel"] == Channel.EMAIL:
            if not hasattr(org, "email_settings"):
                raise CommandError(
                    _("the demo organization has no email settings: run `manage.py demo --smtp HOST:PORT`")
                )
            campaign = Campaign.objects.create(
                organization=org,
                name=options["name"],
                channel=Channel.EMAIL,
                email_subject=DEMO_EMAIL_SUBJECT,
                email_body_format=BodyFormat.MJML,
                email_body=DEMO_EMAIL_BODY,
                control_percent=options["control_percent"],
            )
            self.stdout.write(str(campaign.pk))
            return
        number = org.whatsapp_numbers.filter(phone_number_id=DEMO_PHONE_NUMBER_ID).first()
        if number is None:
            raise CommandError(
                _("the demo organization has no WhatsApp number: run `manage.py demo --graph-url URL`")
            )
        campaign = Campaign.objects.create(
            organization=org,
            name=options["name"],
            channel=Channel.WHATSAPP,
            whatsapp_number=number,
            sender=options["sender"],
            # The sandbox's synced "promo_demo": {{1}} the first name, {{2}} the store.
            template_name="promo_demo",
            template_language="pt_BR",
            template_category="marketing",
            template_variables=["first_name", "store_name"],
            header_image_url="https://example.com.br/ofertas.jpg",
            redirect_url="https://example.com.br/ofertas",
            redirect_button_index=0,
            unsubscribe_button_index=1,
            control_percent=options["control_percent"],
        )
        self.stdout.write(str(campaign.pk))
