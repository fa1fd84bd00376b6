from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from crm import cli
from project.sandboxes.server import wait_for_stop_signal
from project.sandboxes.smtp import SmtpSandbox


def user_and_password(value: str) -> tuple[str, str]:
    """Parse `--require-auth USER:PASSWORD`; argparse reports the ValueError as a bad value."""
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ValueError(value)
    return user, password


class Command(cli.CrmCommand):
    help = (
        "Run the SMTP sandbox (a loopback stand-in for mail servers) in the foreground until Ctrl-C "
        "or SIGTERM. See project/sandboxes/smtp.py."
    )
    # It touches neither the database nor the models: skip the checks so it starts at once.
    requires_system_checks: list[str] = []
    needs = ()
    quiet_logs = False  # a server: its logs are its output

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=2525, help="0 picks a free port (default 2525)")
        parser.add_argument(
            "--require-auth",
            type=user_and_password,
            metavar="USER:PASSWORD",
            help="refuse mail until AUTH with these credentials (default: no AUTH needed, any login works)",
        )
        parser.add_argument(
            "--save-dir",
            type=Path,
            help="write every accepted message there as <queue id>.eml (open it in a mail client)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        save_dir = options["save_dir"]
        if save_dir is not None:
            save_dir.mkdir(parents=True, exist_ok=True)
        sandbox = SmtpSandbox(
            host=options["host"],
            port=options["port"],
            require_auth=options["require_auth"],
            save_dir=save_dir,
            keep=1000,  # memory stays bounded however long it runs
        )
        try:
            sandbox.start()
        except OSError as exc:
            raise CommandError(
                _("cannot listen on %(address)s: %(error)s")
                % {"address": f"{options['host']}:{options['port']}", "error": exc}
            ) from None
        host, port = sandbox.address
        self.stdout.write(
            (
                _("SMTP sandbox listening on %(address)s, saving messages to %(dir)s (Ctrl-C to stop)")
                if save_dir
                else _("SMTP sandbox listening on %(address)s (Ctrl-C to stop)")
            )
            % {"address": f"{host}:{port}", "dir": save_dir}
        )
        self.stdout.flush()
        try:
            wait_for_stop_signal()
        finally:
            sandbox.stop()
        self.stdout.write(_("SMTP sandbox stopped"))
