from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.utils.translation import gettext as _

from crm import embedded, services
from crm.supervisor import Supervisor
from project.demo.integrations import DEMO_ACCESS_TOKEN, DEMO_CHATWOOT_TOKEN, DEMO_PHONE_NUMBER_IDS

# The chance that a demo customer sent a WhatsApp message buys once more within six days: with the
# ERP sandbox's default traffic (about 36% of its customers buy in a 7-day window) a lift of about
# +35% of the buyers rate, what a demo campaign's control group then measures.
DEMO_RESPONSE_RATE = 0.2


class Command(BaseCommand):
    help = (
        "Run everything: the embedded PostgreSQL and Redis (when DATABASE_URL / REDIS_URL are unset), "
        "migrations, an admin login, "
        "the demo data, then web + workers + scheduler under one supervisor. Ctrl-C stops all."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address of the web server and sandboxes")
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("PORT", "8000")),
            help="web port (default $PORT or 8000)",
        )
        parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
        parser.add_argument(
            "--demo-customers", type=int, default=50, help="customers of the demo (default 50)"
        )
        parser.add_argument("--no-demo", action="store_true", help="do not create the demo organization")
        parser.add_argument("--meta-port", type=int, default=8081, help="port of the Meta Graph sandbox")
        parser.add_argument("--smtp-port", type=int, default=2525, help="port of the SMTP sandbox")
        parser.add_argument("--erp-port", type=int, default=8082, help="port of the Millennium ERP sandbox")
        parser.add_argument("--chatwoot-port", type=int, default=8083, help="port of the Chatwoot sandbox")
        parser.add_argument(
            "--no-sandboxes",
            action="store_true",
            help="do not start the sandboxes of the external systems (Meta, SMTP, ERP, Chatwoot)",
        )

    def handle(self, *args, **options) -> None:
        Path(settings.VAR_DIR).mkdir(parents=True, exist_ok=True)
        _check_port(options["host"], options["port"], "--port")
        if not options["no_sandboxes"]:
            _check_port(options["host"], options["meta_port"], "--meta-port")
            _check_port(options["host"], options["smtp_port"], "--smtp-port")
            _check_port(options["host"], options["erp_port"], "--erp-port")
            _check_port(options["host"], options["chatwoot_port"], "--chatwoot-port")
        # Links in emails (pixel, clicks, unsubscribe) point at this server unless set otherwise.
        os.environ.setdefault("PUBLIC_URL", f"http://{options['host']}:{options['port']}")
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        supervisor = Supervisor()
        try:
            self._start_embedded(supervisor)
        except embedded.EmbeddedError as exc:
            supervisor.stop()
            raise CommandError(str(exc)) from None
        try:
            self._prepare(options, supervisor)
        except BaseException:
            connections.close_all()
            supervisor.stop()
            raise
        connections.close_all()  # the embedded PostgreSQL stops last; it waits for no session of ours
        supervisor.add(
            "web", [*manage_gunicorn(), "--bind", f"{options['host']}:{options['port']}"], restart=False
        )
        supervisor.add("workers", [*manage, "workers", "--processes", str(options["workers"])])
        supervisor.add("scheduler", [*manage, "scheduler"])
        if not options["no_sandboxes"]:
            supervisor.add("meta", self._meta_sandbox_argv(manage, options))
            mail_dir = Path(settings.VAR_DIR) / "mail"
            supervisor.add(
                "smtp",
                [
                    *manage,
                    "smtp_sandbox",
                    "--host",
                    options["host"],
                    "--port",
                    str(options["smtp_port"]),
                    "--save-dir",
                    str(mail_dir),
                ],
            )
            supervisor.add("erp", self._erp_sandbox_argv(manage, options))
            supervisor.add(
                "chatwoot",
                [
                    *manage,
                    "chatwoot_sandbox",
                    "--host",
                    options["host"],
                    "--port",
                    str(options["chatwoot_port"]),
                    "--token",
                    DEMO_CHATWOOT_TOKEN,
                ],
            )
        base = f"http://{options['host']}:{options['port']}"
        supervisor.say(
            _("admin: %(admin)s   health: %(health)s   (Ctrl-C stops everything)")
            % {"admin": f"{base}/admin/", "health": f"{base}/healthz"}
        )
        code = supervisor.run()
        if code:
            raise CommandError(_("stopped: a process exited with status %(code)s") % {"code": code})

    @staticmethod
    def _start_embedded(supervisor: Supervisor) -> None:
        """The embedded PostgreSQL and Redis (each unless its URL is set), stopped last."""
        if settings.EMBEDDED_DATABASE:
            postgres: embedded.Postgres = settings.EMBEDDED_POSTGRES
            postgres.ensure_initialized()
            proc = supervisor.add(
                "postgres",
                postgres.server_argv(),
                stop_last=True,
                stop_signal=signal.SIGINT,  # fast shutdown: roll back sessions, checkpoint, exit
                user=postgres.system_user,
            )
            supervisor.start(proc)
            postgres.wait_ready(
                timeout=60, alive=lambda: proc.popen is not None and proc.popen.poll() is None
            )
            postgres.ensure_database()
            supervisor.say(_("embedded PostgreSQL in %(path)s") % {"path": postgres.data})
        if settings.EMBEDDED_REDIS:
            server: embedded.Redis = settings.EMBEDDED_REDIS_SERVER
            proc = supervisor.add("redis", server.server_argv(), stop_last=True)
            supervisor.start(proc)
            server.wait_ready(timeout=15, alive=lambda: proc.popen is not None and proc.popen.poll() is None)
            supervisor.say(_("embedded Redis on %(path)s") % {"path": server.socket})

    def _prepare(self, options: dict, supervisor: Supervisor) -> None:
        supervisor.say(_("migrating the database"))
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        username, password = _ensure_admin()
        if password:
            supervisor.say(
                _("admin login: %(username)s / %(password)s") % {"username": username, "password": password}
            )
        else:
            supervisor.say(
                _("admin login: %(username)s (password unchanged; set ADMIN_PASSWORD to reset it)")
                % {"username": username}
            )
        if not options["no_demo"]:
            extra = (
                {}
                if options["no_sandboxes"]
                else {
                    "graph_url": self._meta_url(options),
                    "smtp": (options["host"], options["smtp_port"]),
                    "erp_url": f"http://{options['host']}:{options['erp_port']}",
                    "chatwoot_url": f"http://{options['host']}:{options['chatwoot_port']}",
                }
            )
            extra["public_url"] = os.environ["PUBLIC_URL"]  # this server: the demo webhook's curl line
            call_command("demo", customers=options["demo_customers"], stdout=_Say(supervisor), **extra)

    @staticmethod
    def _meta_url(options: dict) -> str:
        return f"http://{options['host']}:{options['meta_port']}"

    @classmethod
    def _erp_sandbox_argv(cls, manage: list[str], options: dict) -> list[str]:
        """The Millennium ERP sandbox, whose sales respond to the demo's WhatsApp messages (a modest
        true uplift, so a demo campaign with a control group has a lift to report: docs/analytics.md)."""
        return [
            *manage,
            "erp_sandbox",
            "--host",
            options["host"],
            "--port",
            str(options["erp_port"]),
            "--responds-to",
            cls._meta_url(options),
            "--response-rate",
            str(DEMO_RESPONSE_RATE),
        ]

    @staticmethod
    def _meta_sandbox_argv(manage: list[str], options: dict) -> list[str]:
        """The Meta Graph sandbox, accepting the demo token for each demo number (the organization's
        and its stores') and posting signed status webhooks back to this web server."""
        argv = [*manage, "whatsapp_sandbox", "--host", options["host"], "--port", str(options["meta_port"])]
        for phone_number_id in DEMO_PHONE_NUMBER_IDS:
            argv += ["--number", f"{phone_number_id}={DEMO_ACCESS_TOKEN}"]
        if settings.WHATSAPP_APP_SECRET:
            argv += [
                "--webhook-url",
                f"http://{options['host']}:{options['port']}/webhooks/whatsapp/",
                "--app-secret",
                settings.WHATSAPP_APP_SECRET,
            ]
        return argv


def _check_port(host: str, port: int, option: str) -> None:
    with socket.socket() as probe:
        # As the servers themselves do: a port whose last connections sit in TIME_WAIT (a restart
        # right after Ctrl-C) is free to listen on.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise CommandError(
                _("cannot listen on %(host)s:%(port)s (%(error)s); pass %(option)s")
                % {"host": host, "port": port, "error": exc.strerror, "option": option}
            ) from None


def manage_gunicorn(
    *, workers: int = 2, threads: int = 4, access_log: bool = True, reuse_port: bool = False
) -> list[str]:
    """The web server's command (`up`, the tests' web_server, the intake benchmark): add --bind.

    `reuse_port` (the webhook intake's production command): each worker process listens on its own
    SO_REUSEPORT socket, so the kernel spreads connections evenly over the workers. With one shared
    socket, whichever worker wakes first accepts: in a burst of 1,000 connections one worker held
    500 and another 3, and the busiest worker's queue set the latency (p99 twice p50)."""
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "crm.wsgi:application",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        # Idle keep-alive connections wait 75 s (nginx's upstream default; gunicorn's own is 2 s):
        # a sender that reuses a connection the server has just closed sees "server disconnected",
        # and a request whose body arrives late on a busy machine is cut off. Idle connections
        # cost no thread (gthread keeps them on its poller).
        "--keep-alive",
        "75",
        *(["--access-logfile", "-"] if access_log else []),
        "--chdir",
        str(settings.BASE_DIR),
        # gunicorn keeps a control socket in $HOME by default: two checkouts would share it.
        "--no-control-socket",
        *(["--reuse-port"] if reuse_port else []),
    ]


class _Say:
    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def write(self, text: str) -> None:
        if text.strip():
            self.supervisor.say(text.strip())

    def flush(self) -> None:
        pass


def _ensure_admin() -> tuple[str, str | None]:
    """The admin login (a superuser): ADMIN_USERNAME/ADMIN_PASSWORD from the environment, else admin +
    a generated password kept in var/admin-password (0600). Returns the password when it is known."""
    return services.login_from_environment(prefix="ADMIN", default_username="admin", superuser=True)
