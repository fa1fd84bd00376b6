from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from crm import services


class Command(BaseCommand):
    help = "Create or update (idempotently) the demo organization (slug 'demo'), its stores and customers."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--customers", type=int, default=50, help="number of customers (default 50)")
        parser.add_argument(
            "--graph-url",
            default="",
            help="point the demo WhatsApp number at this Graph API (e.g. the sandbox)",
        )

    def handle(self, *args, **options) -> None:
        n = options["customers"]
        if n < 0:
            raise CommandError("--customers must be 0 or more")
        with tqdm(total=n, unit="customers", disable=n < 5000 or not self.stdout.isatty()) as bar:
            org = services.demo_load(customers=n, progress=bar.update)
        if options["graph_url"]:
            from integrations.services import whatsapp_number_demo

            number = whatsapp_number_demo(organization=org, graph_url=options["graph_url"])
            self.stdout.write(f"demo WhatsApp number {number.phone_number_id} -> {options['graph_url']}")
        self.stdout.write(
            f"demo organization '{org.slug}' (id {org.pk}): {org.stores.count()} stores, "
            f"{org.customers.count()} customers"
        )
