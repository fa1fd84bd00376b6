from __future__ import annotations

from typing import Any

import httpx
from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from crm import cli
from integrations.models import WhatsappNumber
from project.demo.integrations import DEMO_PHONE_NUMBER_IDS


class Command(cli.CrmCommand):
    help = (
        "Have the Meta sandbox post a customer's WhatsApp message to this server's webhook, as Meta "
        'would: e.g. `sandbox_inbound +5511987650001 "PARAR"` (make run starts the sandbox).'
    )
    needs = ()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("phone", help="the customer's phone, E.164 or digits")
        parser.add_argument("text", help="what the customer writes")
        parser.add_argument(
            "--sandbox-url",
            default="",
            help="the Meta sandbox (default: the business number's Graph URL, where `make run` put it)",
        )
        parser.add_argument(
            "--phone-number-id", default=DEMO_PHONE_NUMBER_IDS[0], help="the business number written to"
        )
        parser.add_argument(
            "--type", default="text", choices=["text", "button", "image"], help="message type"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        body = {
            "from": options["phone"].lstrip("+"),
            "text": options["text"],
            "type": options["type"],
            "phone_number_id": options["phone_number_id"],
        }
        url = options["sandbox_url"] or _graph_url(options["phone_number_id"])
        try:
            response = httpx.post(f"{url.rstrip('/')}/_sandbox/inbound", json=body, timeout=30)
        except httpx.HTTPError as exc:
            raise CommandError(_("the Meta sandbox did not answer: %(error)s") % {"error": exc}) from None
        if response.status_code != 200:
            raise CommandError(response.text[:300])
        data = response.json()
        self.stdout.write(
            _("posted %(wamid)s to the webhook (delivered: %(delivered)s)")
            % {"wamid": data.get("wamid"), "delivered": data.get("delivered")}
        )


def _graph_url(phone_number_id: str) -> str:
    """The sandbox a business number talks to (`make run --meta-port` sets it), else the deployment's."""
    number = WhatsappNumber.objects.filter(phone_number_id=phone_number_id).only("graph_url").first()
    return number.graph_url if number is not None and number.graph_url else settings.WHATSAPP_GRAPH_URL
