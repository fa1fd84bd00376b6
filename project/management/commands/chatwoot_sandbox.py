from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from crm import cli
from project.demo.integrations import DEMO_CHATWOOT_TOKEN
from project.sandboxes.chatwoot import ChatwootSandbox
from project.sandboxes.server import wait_for_stop_signal


class Command(cli.CrmCommand):
    help = (
        "Run the Chatwoot sandbox (the application API's contacts, conversations and messages) in the "
        "foreground until Ctrl-C or SIGTERM; GET /_sandbox/conversations shows what an agent would see."
    )
    requires_system_checks: list[str] = []
    needs = ()
    quiet_logs = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8083, help="0 picks a free port (default 8083)")
        parser.add_argument("--token", default=DEMO_CHATWOOT_TOKEN, help="the API access token of account 1")
        parser.add_argument("--latency-ms", type=float, default=0.0, help="delay added to every answer")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            server = ChatwootSandbox(
                host=options["host"],
                port=options["port"],
                accounts={1: options["token"]},
                latency_ms=max(options["latency_ms"], 0.0),
            )
            server.start()
        except OSError as exc:
            raise CommandError(
                _("cannot listen on %(address)s: %(error)s")
                % {"address": f"{options['host']}:{options['port']}", "error": exc}
            ) from None
        self.stdout.write(
            _("Chatwoot sandbox listening on %(url)s (conversations: %(url)s/_sandbox/conversations)")
            % {"url": server.url}
        )
        self.stdout.flush()
        try:
            wait_for_stop_signal()
        finally:
            server.stop()
        self.stdout.write(_("Chatwoot sandbox stopped"))
