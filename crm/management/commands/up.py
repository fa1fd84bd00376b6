from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from crm import embedded
from crm.supervisor import Supervisor


class Command(BaseCommand):
    help = (
        "Run everything: the embedded Redis (when REDIS_URL is unset), migrations, an admin login, "
        "the demo data, then web + workers + scheduler under one supervisor. Ctrl-C stops all."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
        parser.add_argument("--demo-customers", type=int, default=50)
        parser.add_argument("--no-demo", action="store_true")
        parser.add_argument("--meta-port", type=int, default=8081, help="port of the Meta Graph sandbox")
        parser.add_argument("--smtp-port", type=int, default=2525, help="port of the SMTP sandbox")
        parser.add_argument("--erp-port", type=int, default=8082, help="port of the Millennium ERP sandbox")
        parser.add_argument(
            "--no-sandboxes",
            action="store_true",
            help="do not start the sandboxes of the external systems (Meta, SMTP, ERP)",
        )

    def handle(self, *args, **options) -> None:
        Path(settings.VAR_DIR).mkdir(parents=True, exist_ok=True)
        _check_port(options["host"], options["port"], "--port")
        if not options["no_sandboxes"]:
            _check_port(options["host"], options["meta_port"], "--meta-port")
            _check_port(options["host"], options["smtp_port"], "--smtp-port")
            _check_port(options["host"], options["erp_port"], "--erp-port")
        # Links in emails (pixel, clicks, unsubscribe) point at this server unless set otherwise.
        os.environ.setdefault("PUBLIC_URL", f"http://{options['host']}:{options['port']}")
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        supervisor = Supervisor()
        if settings.EMBEDDED_REDIS:
            try:
                argv = embedded.server_argv()
            except embedded.EmbeddedRedisError as exc:
                raise CommandError(str(exc)) from None
            redis_proc = supervisor.add("redis", argv, restart=True, stop_last=True)
            supervisor.start(redis_proc)
            deadline = time.monotonic() + 15
            while not embedded.ping(settings.EMBEDDED_REDIS_SOCKET):
                if (redis_proc.popen and redis_proc.popen.poll() is not None) or time.monotonic() > deadline:
                    supervisor.stop()
                    raise CommandError("the embedded Redis did not start; see its output above")
                time.sleep(0.05)
            supervisor.say(f"embedded Redis on {settings.EMBEDDED_REDIS_SOCKET}")
        try:
            self._prepare(options, supervisor)
        except BaseException:
            supervisor.stop()
            raise
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
            supervisor.add(
                "erp",
                [*manage, "erp_sandbox", "--host", options["host"], "--port", str(options["erp_port"])],
            )
        supervisor.say(
            f"admin: http://{options['host']}:{options['port']}/admin/   "
            f"health: http://{options['host']}:{options['port']}/healthz   (Ctrl-C stops everything)"
        )
        code = supervisor.run()
        if code:
            raise CommandError(f"stopped: a process exited with status {code}")

    def _prepare(self, options: dict, supervisor: Supervisor) -> None:
        supervisor.say("migrating the database")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        username, password = _ensure_admin()
        if password:
            supervisor.say(f"admin login: {username} / {password}")
        else:
            supervisor.say(f"admin login: {username} (password unchanged; set ADMIN_PASSWORD to reset it)")
        if not options["no_demo"]:
            extra = (
                {}
                if options["no_sandboxes"]
                else {
                    "graph_url": self._meta_url(options),
                    "smtp": (options["host"], options["smtp_port"]),
                    "erp_url": f"http://{options['host']}:{options['erp_port']}",
                }
            )
            extra["public_url"] = os.environ["PUBLIC_URL"]  # this server: the demo webhook's curl line
            call_command("demo", customers=options["demo_customers"], stdout=_Say(supervisor), **extra)

    @staticmethod
    def _meta_url(options: dict) -> str:
        return f"http://{options['host']}:{options['meta_port']}"

    @staticmethod
    def _meta_sandbox_argv(manage: list[str], options: dict) -> list[str]:
        """The Meta Graph sandbox, accepting the demo number's token and posting signed status
        webhooks back to this web server."""
        from integrations.services import DEMO_ACCESS_TOKEN, DEMO_PHONE_NUMBER_ID

        argv = [
            *manage,
            "whatsapp_sandbox",
            "--host",
            options["host"],
            "--port",
            str(options["meta_port"]),
            "--number",
            f"{DEMO_PHONE_NUMBER_ID}={DEMO_ACCESS_TOKEN}",
        ]
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
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port} ({exc.strerror}); pass {option}") from None


def manage_gunicorn() -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "crm.wsgi:application",
        "--workers",
        "2",
        "--threads",
        "4",
        "--access-logfile",
        "-",
        "--chdir",
        str(settings.BASE_DIR),
        # gunicorn keeps a control socket in $HOME by default: two checkouts would share it.
        "--no-control-socket",
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
    """The admin login: ADMIN_USERNAME/ADMIN_PASSWORD from the environment, else admin + a generated
    password kept in var/admin-password (0600). Returns the password when it was (re)set."""
    user_model = get_user_model()
    username = os.environ.get("ADMIN_USERNAME", "admin")
    password = os.environ.get("ADMIN_PASSWORD")
    saved = Path(settings.VAR_DIR) / "admin-password"
    user = user_model.objects.filter(username=username).first()
    if user is not None and not password:
        return username, saved.read_text().strip() if saved.exists() else None
    if not password:
        password = secrets.token_urlsafe(12)
        saved.write_text(password + "\n")
        saved.chmod(0o600)
    if user is None:
        user_model.objects.create_superuser(username=username, email="", password=password)
    else:
        user.set_password(password)
        user.is_staff = user.is_superuser = True
        user.save(update_fields=["password", "is_staff", "is_superuser"])
    return username, password
