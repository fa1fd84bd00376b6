from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from crm import cli
from project.sandboxes.millennium import MillenniumSandbox
from project.sandboxes.millennium_data import DEFAULT_PASSWORD, DEFAULT_STORES, DEFAULT_USERNAME
from project.sandboxes.server import wait_for_stop_signal


class Command(cli.CrmCommand):
    help = (
        "Run the Linx Millennium ERP sandbox (deterministic customers and sales) in the foreground "
        "until Ctrl-C or SIGTERM. Controls live under /_sandbox/ (see project/sandboxes/millennium.py)."
    )
    # It touches neither the database nor the models: skip the checks so it starts at once.
    requires_system_checks: list[str] = []
    needs = ()
    quiet_logs = False  # a server: its logs are its output

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8082, help="0 picks a free port (default 8082)")
        parser.add_argument("--customers", type=int, default=1000, help="number of customers (default 1000)")
        parser.add_argument(
            "--stores",
            default=",".join(DEFAULT_STORES),
            help=f"comma-separated store (filial) codes (default {','.join(DEFAULT_STORES)})",
        )
        parser.add_argument(
            "--sales-per-day", type=int, default=24, help="sales per store and day (default 24)"
        )
        parser.add_argument(
            "--username", default=DEFAULT_USERNAME, help=f"the login it accepts (default {DEFAULT_USERNAME})"
        )
        parser.add_argument("--password", default=DEFAULT_PASSWORD, help="the password it accepts")
        parser.add_argument("--latency-ms", type=float, default=0.0, help="delay added to every answer")
        parser.add_argument(
            "--malformed-every", type=int, default=0, help="break every k-th record (default 0: none)"
        )
        parser.add_argument(
            "--response-rate",
            type=float,
            default=0.0,
            help="the chance that a customer sent a WhatsApp message buys once more within "
            "--response-days (default 0: sales do not respond to messages)",
        )
        parser.add_argument(
            "--response-days", type=int, default=6, help="how soon a response sale comes (default 6 days)"
        )
        parser.add_argument(
            "--response-seed", type=int, default=0, help="the seed of who responds and when (default 0)"
        )
        parser.add_argument(
            "--responds-to",
            help="a WhatsApp sandbox's URL: its sent messages are the ones customers respond to",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["latency_ms"] < 0:
            raise CommandError(_("--latency-ms must be 0 or more"))
        stores = [code.strip() for code in options["stores"].split(",") if code.strip()]
        try:
            server = MillenniumSandbox(
                host=options["host"],
                port=options["port"],
                customers=options["customers"],
                stores=stores,
                sales_per_day=options["sales_per_day"],
                username=options["username"],
                password=options["password"],
                latency_ms=options["latency_ms"],
                malformed_every=options["malformed_every"],
                response_rate=options["response_rate"],
                response_days=options["response_days"],
                response_seed=options["response_seed"],
                responds_to=options["responds_to"],
            )
            server.start()
        except OSError as exc:
            raise CommandError(
                _("cannot listen on %(address)s: %(error)s")
                % {"address": f"{options['host']}:{options['port']}", "error": exc}
            ) from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            _(
                "Millennium ERP sandbox listening on %(url)s with %(customers)s customers, "
                "stores %(stores)s (Ctrl-C to stop)"
            )
            % {"url": server.url, "customers": cli.number(options["customers"]), "stores": ", ".join(stores)}
        )
        self.stdout.flush()
        try:
            wait_for_stop_signal()
        finally:
            server.stop()
        self.stdout.write(_("Millennium ERP sandbox stopped"))
