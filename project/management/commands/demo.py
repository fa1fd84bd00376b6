from __future__ import annotations

import json
import shlex
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _
from tqdm import tqdm

from crm import cli, services
from crm.models import Membership, Organization
from erp.upserts import customers_upsert
from integrations import outbound
from integrations.errors import IntegrationError
from integrations.models import WhatsappNumber
from integrations.services import whatsapp_templates_sync, whatsapp_templates_sync_enqueue
from project.demo.crm import demo_load
from project.demo.erp import erp_connection_demo
from project.demo.flows import flows_demo
from project.demo.integrations import chatwoot_account_demo, email_settings_demo, whatsapp_number_demo
from runner import demo


def host_port(value: str) -> tuple[str, int]:
    """Parse `--smtp HOST:PORT`; argparse reports the ValueError as an invalid value."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(value)
    return host, int(port)


class Command(cli.CrmCommand):
    help = "Create or update (idempotently) the demo organization (slug 'demo'), its stores and customers."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--customers", type=int, default=50, help="number of customers (default 50)")
        parser.add_argument(
            "--graph-url",
            default="",
            help="point the demo WhatsApp number at this Graph API (e.g. the sandbox)",
        )
        parser.add_argument(
            "--smtp",
            type=host_port,
            metavar="HOST:PORT",
            help="point the demo organization's email at this SMTP server (no TLS, no login), "
            "e.g. the sandbox",
        )
        parser.add_argument(
            "--erp-url",
            default="",
            help="point the demo organization's ERP connection at this Millennium server (e.g. the sandbox, "
            "whose login it uses); its stores' codes are the sandbox's",
        )
        parser.add_argument(
            "--chatwoot-url",
            default="",
            help="point the demo organization's Chatwoot at this server (the sandbox: account 1, inbox 1)",
        )
        parser.add_argument(
            "--public-url",
            default="",
            help="the address of this deployment's web server, for the demo integration's curl line "
            "(default: PUBLIC_URL)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        n = options["customers"]
        if n < 0:
            raise CommandError(_("--customers must be 0 or more"))
        with tqdm(total=n, unit=_(" customers"), disable=n < 5000 or not self.stdout.isatty()) as bar:
            org = demo_load(customers_upsert=customers_upsert, customers=n, progress=bar.update)
        if options["graph_url"]:
            outbound.trust_origin(options["graph_url"])  # the operator's choice: loopback in every mode
            number = whatsapp_number_demo(organization=org, graph_url=options["graph_url"])
            self.stdout.write(
                _("demo WhatsApp number %(number)s -> %(url)s")
                % {"number": number.phone_number_id, "url": options["graph_url"]}
            )
            self._sync_templates(number)
        if options["smtp"]:
            host, port = options["smtp"]
            outbound.trust_origin(f"smtp://[{host}]:{port}" if ":" in host else f"smtp://{host}:{port}")
            email_settings_demo(organization=org, host=host, port=port)
            self.stdout.write(
                _("demo email via SMTP %(address)s (no TLS, no login)") % {"address": f"{host}:{port}"}
            )
        if options["chatwoot_url"]:
            outbound.trust_origin(options["chatwoot_url"])
            chatwoot_account_demo(organization=org, base_url=options["chatwoot_url"])
            self.stdout.write(
                _("demo Chatwoot -> %(url)s (what agents see: %(url)s/_sandbox/conversations)")
                % {"url": options["chatwoot_url"]}
            )
        if options["erp_url"]:
            outbound.trust_origin(options["erp_url"])
            erp_connection_demo(organization=org, base_url=options["erp_url"])
            self.stdout.write(
                _("demo ERP -> %(url)s (pull its customers: manage.py erp_sync customers --full)")
                % {"url": options["erp_url"]}
            )
        self.stdout.write(
            _("demo organization '%(slug)s' (id %(id)s): %(stores)s stores, %(customers)s customers")
            % {
                "slug": org.slug,
                "id": org.pk,
                "stores": cli.number(org.stores.count()),
                "customers": cli.number(org.customers.count()),
            }
        )
        flows = flows_demo(organization=org)
        self.stdout.write(
            _("demo flows of '%(slug)s': %(keys)s (docs/flows.md; fire them by hand: README)")
            % {"slug": org.slug, "keys": ", ".join(f.key for f in flows)}
        )
        self._manager_login(org)
        self._integration(org, options["public_url"] or settings.PUBLIC_URL)

    def _manager_login(self, org: Organization) -> None:
        """A manager of the demo organization (sees and works only its data, unlike the operator):
        DEMO_MANAGER_USERNAME/DEMO_MANAGER_PASSWORD, else demo-manager with a generated password kept
        in var/demo-manager-password (0600)."""
        username, password = services.login_from_environment(
            prefix="DEMO_MANAGER", default_username="demo-manager", superuser=False
        )
        user = get_user_model().objects.get(username=username)
        services.membership_set(user=user, organization=org, role=Membership.Role.MANAGER)
        self.stdout.write(
            _("manager login of '%(slug)s': %(username)s / %(password)s")
            % {"slug": org.slug, "username": username, "password": password or _("(unchanged)")}
        )

    def _integration(self, org: Organization, public_url: str) -> None:
        """The demo integration of the runner, and how to start it: a run, and a webhook (its token
        is the demo's own, generated once and kept in the handler, encrypted)."""
        handler, token = demo.integration_demo(organization_id=org.pk)
        keys = f"{demo.INTEGRATION_KEY} {demo.HANDLER_KEY}"
        url = f"{public_url.rstrip('/')}/hooks/{demo.INTEGRATION_KEY}/{demo.HANDLER_KEY}"
        curl = shlex.join(
            [
                "curl",
                "-X",
                "POST",
                url,
                "-H",
                f"Authorization: Bearer {token}",
                "-H",
                "Content-Type: application/json",
                "-d",
                json.dumps(demo.EXAMPLE_SIGNUP),
            ]
        )
        self.stdout.write(
            _("demo integration %(handler)s (the online shop's sign-ups become customers):")
            % {"handler": handler}
        )
        self.stdout.write(
            _("  run it:   %(command)s")
            % {"command": f".venv/bin/python manage.py runner_run {keys} --org {org.slug}"}
        )
        self.stdout.write(_("  webhook:  %(curl)s") % {"curl": curl})

    def _sync_templates(self, number: WhatsappNumber) -> None:
        """The demo's templates, synced from the sandbox as a real account's are from Meta (the
        composer's list): now when the sandbox answers, else in a job a few seconds later (`up`
        starts the sandbox after the demo is loaded)."""
        try:
            counts = whatsapp_templates_sync(number=number)
        except IntegrationError:
            whatsapp_templates_sync_enqueue(organization_id=number.organization_id, delay=10)
            self.stdout.write(_("demo WhatsApp templates: synced by a job once the sandbox answers"))
            return
        self.stdout.write(_("demo WhatsApp templates synced: %(counts)s") % {"counts": counts})
