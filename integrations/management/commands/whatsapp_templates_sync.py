from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from crm import cli
from integrations.services import whatsapp_templates_sync_all


class Command(cli.CrmCommand):
    help = (
        "Fetch the message templates of every WhatsApp Business account (or one organization's) from "
        "Meta now; the daily cron entry whatsapp-templates-sync does the same."
    )
    needs = (cli.DATABASE,)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", metavar="SLUG", help="only this organization")

    def handle(self, *args: Any, **options: Any) -> None:
        org = cli.organization_or_error(options["org"]) if options["org"] else None
        totals = whatsapp_templates_sync_all(organization_id=org.pk if org else None)
        self.stdout.write(
            _(
                "%(accounts)s business account(s): %(templates)s template(s), %(approved)s approved, "
                "%(removed)s removed"
            )
            % {k: cli.number(v) for k, v in totals.items()}
        )
        if totals["failed"]:
            raise CommandError(_("%(failed)s business account(s) could not be synced (see the log)") % totals)
