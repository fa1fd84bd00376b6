from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from crm import cli
from project.sandboxes.server import wait_for_stop_signal
from project.sandboxes.whatsapp import SandboxServer


def number_and_token(value: str) -> tuple[str, str]:
    """Parse `--number PHONE_NUMBER_ID=TOKEN`; argparse reports the ValueError as a bad value."""
    phone_number_id, sep, token = value.partition("=")
    if not sep or not phone_number_id or not token:
        raise ValueError(value)
    return phone_number_id, token


class Command(cli.CrmCommand):
    help = (
        "Run the WhatsApp Cloud API sandbox (a stand-in for Meta's Graph API) in the foreground "
        "until Ctrl-C or SIGTERM. Controls live under /_sandbox/ (see project/sandboxes/whatsapp/)."
    )
    # It touches neither the database nor the models: skip the checks so it starts at once.
    requires_system_checks: list[str] = []
    needs = ()
    quiet_logs = False  # a server: its logs are its output

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8081, help="0 picks a free port (default 8081)")
        parser.add_argument("--latency-ms", type=float, default=0.0, help="delay added to every send")
        parser.add_argument("--webhook-url", help="where to POST sent/delivered/read status callbacks")
        parser.add_argument("--app-secret", help="signs the status callbacks (X-Hub-Signature-256)")
        parser.add_argument(
            "--token",
            action="append",
            default=[],
            help="an access token accepted for any phone_number_id (repeatable; none = accept any token)",
        )
        parser.add_argument(
            "--number",
            action="append",
            default=[],
            type=number_and_token,
            metavar="PHONE_NUMBER_ID=TOKEN",
            help="a phone_number_id and the token it accepts (repeatable)",
        )
        parser.add_argument(
            "--drop-ninth-digit",
            action="store_true",
            help="answer Brazilian mobiles with the wa_id Meta gives old accounts (without the 9)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["latency_ms"] < 0:
            raise CommandError(_("--latency-ms must be 0 or more"))
        server = SandboxServer(
            host=options["host"],
            port=options["port"],
            numbers=dict(options["number"]),
            tokens=options["token"],
            latency_ms=options["latency_ms"],
            webhook_url=options["webhook_url"],
            app_secret=options["app_secret"],
            drop_ninth_digit=options["drop_ninth_digit"],
        )
        try:
            server.start()
        except OSError as exc:
            raise CommandError(
                _("cannot listen on %(address)s: %(error)s")
                % {"address": f"{options['host']}:{options['port']}", "error": exc}
            ) from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            _("WhatsApp Cloud API sandbox listening on %(url)s (Ctrl-C to stop)") % {"url": server.url}
        )
        self.stdout.flush()
        try:
            wait_for_stop_signal()
        finally:
            server.stop()
        self.stdout.write(_("WhatsApp Cloud API sandbox stopped"))
