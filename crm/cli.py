"""What the project's management commands share: one language, one line when PostgreSQL or Redis
cannot be reached, numbers in the operator's format, and `--watch`.

A command subclasses `CrmCommand` and names what it needs in `needs`; both are checked before
`handle` runs, so a command that writes to the database and then enqueues changes nothing when
Redis is down. A connection error that still escapes a command (a service that went away midway)
becomes the same one line, never a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from decimal import ROUND_HALF_UP, Decimal
from itertools import islice
from typing import Any
from urllib.parse import urlparse

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.utils import formats, timezone, translation
from django.utils.translation import gettext as _

from crm import jobs, queues
from crm.models import Organization

DATABASE = "database"
REDIS = "redis"

REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
DATABASE_DOWN = (OperationalError, InterfaceError)
PROBE_TIMEOUT = 5.0  # seconds: an address that drops packets fails the check instead of hanging


def number(value: float | int | Any, decimals: int | None = None) -> str:
    """`value` as the operator's language writes it: 12.345,6 in pt-br, 12,345.6 in en; rounded half
    up to `decimals` (Django's number_format cuts a Decimal's digits: 66.66… would read 66,6)."""
    if decimals is not None and isinstance(value, Decimal):
        value = value.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    return formats.number_format(value, decimal_pos=decimals, use_l10n=True, force_grouping=True)


def listing(values: Iterable[str], limit: int = 20) -> str:
    """`a, b, c` (the first `limit`, then `…`), or "(none)"; for errors that name what exists."""
    shown = list(islice(values, limit + 1))
    if not shown:
        return _("(none)")
    return ", ".join(shown[:limit]) + (", …" if len(shown) > limit else "")


def organization_or_error(slug: str) -> Organization:
    """The organization with this slug, or a CommandError that names it and lists some that exist."""
    org = Organization.objects.filter(slug=slug).first()
    if org is None:
        slugs = Organization.objects.order_by("slug").values_list("slug", flat=True)[:21]
        raise CommandError(
            _("no organization %(slug)r (organizations: %(slugs)s)") % {"slug": slug, "slugs": listing(slugs)}
        )
    return org


# --- reachability ---------------------------------------------------------------------------------


def redis_where() -> str:
    """Where the project's Redis is (socket path or host:port, sentinels), never its password."""
    config = settings.RQ_QUEUES[queues.QUEUE_NAMES[0]]
    if "SENTINELS" in config:
        hosts = ",".join(_host_port(host, port) for host, port in config["SENTINELS"])
        return f"sentinel {hosts} (master {config['MASTER_NAME']})"
    url = urlparse(config["URL"])
    if url.scheme == "unix":
        return url.path
    try:
        port = url.port or 6379
    except ValueError:  # a malformed port: name the host alone
        return url.hostname or "?"
    return _host_port(url.hostname or "?", port)


def database_where(alias: str = DEFAULT_DB_ALIAS) -> str:
    """Where the database server is (host:port, or the Unix socket's path), never its password."""
    db: dict[str, Any] = settings.DATABASES[alias]
    options: dict[str, Any] = db.get("OPTIONS") or {}
    host = str(db.get("HOST") or options.get("host") or "")
    port = str(db.get("PORT") or "5432")
    if host.startswith("/"):
        return f"{host}/.s.PGSQL.{port}"
    if not host:
        return _("the default local socket")
    return _host_port(host, port)


def _host_port(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _redis_reason(exc: BaseException) -> str:
    # "Error 111 connecting to 127.0.0.1:1. Connection refused." -> "Connection refused"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if text.startswith("Error ") and ". " in text:
        text = text.split(". ", 1)[1]
    return text.rstrip(".")


def _database_reason(exc: BaseException) -> str:
    # 'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused'
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text.rsplit("failed: ", 1)[-1]
    return " ".join(text.removeprefix("FATAL:").split())


def redis_problem() -> str | None:
    """Why Redis cannot be reached (a short reason), or None when it answers a PING."""
    client = jobs.get_connection()
    pool = client.connection_pool
    own = type(pool) is redis.ConnectionPool  # Sentinel's pool finds the master itself: use it as is
    if own:
        timeouts = {"socket_connect_timeout": PROBE_TIMEOUT, "socket_timeout": PROBE_TIMEOUT}
        pool = redis.ConnectionPool(
            connection_class=pool.connection_class, **{**pool.connection_kwargs, **timeouts}
        )
        client = redis.Redis(connection_pool=pool)
    try:
        client.ping()
    except (*REDIS_DOWN, OSError) as exc:
        return _redis_reason(exc)
    finally:
        if own:
            pool.disconnect()
    return None


def database_problem(*, fresh: bool = False) -> str | None:
    """Why the database cannot be reached (a short reason), or None when it accepts a connection.

    `fresh` tries a new connection, for when the current one may be the broken one."""
    connection = connections.create_connection(DEFAULT_DB_ALIAS) if fresh else connections[DEFAULT_DB_ALIAS]
    try:
        connection.ensure_connection()
    except DATABASE_DOWN as exc:
        return _database_reason(exc)
    finally:
        if fresh:
            connection.close()
    return None


def _hint(service: str) -> str:
    embedded = settings.EMBEDDED_REDIS if service == REDIS else getattr(settings, "EMBEDDED_DATABASE", False)
    if embedded:
        return _("start the stack with `make run`")
    return _("check REDIS_URL") if service == REDIS else _("check DATABASE_URL")


def unreachable_line(problems: dict[str, str]) -> str:
    """One line naming each service that cannot be reached, where, why, and what to do."""
    by_hint: dict[str, list[str]] = {}
    for service, reason in problems.items():
        name = "Redis" if service == REDIS else connections[DEFAULT_DB_ALIAS].display_name
        where = redis_where() if service == REDIS else database_where()
        by_hint.setdefault(_hint(service), []).append(
            _("%(service)s at %(where)s (%(reason)s)") % {"service": name, "where": where, "reason": reason}
        )
    return "; ".join(
        _("cannot connect to %(what)s: %(hint)s") % {"what": _(" and ").join(what), "hint": hint}
        for hint, what in by_hint.items()
    )


def check_reachable(needs: Iterable[str]) -> None:
    """Raise CommandError with one line if a needed service cannot be reached."""
    checks: dict[str, Callable[[], str | None]] = {DATABASE: database_problem, REDIS: redis_problem}
    problems = {service: problem for service in needs if (problem := checks[service]())}
    if problems:
        raise CommandError(unreachable_line(problems))


@contextlib.contextmanager
def _info_logs(shown: bool) -> Iterator[None]:
    if shown:
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.INFO))
    try:
        yield
    finally:
        logging.disable(previous)


# --- the base command -----------------------------------------------------------------------------


class CrmCommand(BaseCommand):
    """A management command in the operator's language (settings.LANGUAGE_CODE) that fails with one
    line when what it `needs` cannot be reached."""

    # What must answer before the command does anything (DATABASE, REDIS); () for the sandboxes.
    needs: tuple[str, ...] = (DATABASE,)
    # One-shot commands print their own result: the INFO logs of what they call (which repeat it,
    # in English) show only with -v 2. Long-running commands (workers, consumers) keep their logs.
    quiet_logs = True

    def execute(self, *args: Any, **options: Any) -> Any:
        verbose = options.get("verbosity", 1) >= 2 or not self.quiet_logs
        with translation.override(settings.LANGUAGE_CODE), _info_logs(verbose):
            try:
                check_reachable(self.needs)
                return super().execute(*args, **options)
            except REDIS_DOWN:
                problem = redis_problem()
                if problem is None:
                    raise
                raise CommandError(unreachable_line({REDIS: problem})) from None
            except DATABASE_DOWN:
                problem = database_problem(fresh=True)
                if problem is None:
                    raise
                raise CommandError(unreachable_line({DATABASE: problem})) from None

    @staticmethod
    def add_watch_argument(parser: Any, what: str) -> None:
        parser.add_argument(
            "--watch",
            nargs="?",
            const=2.0,
            type=float,
            metavar="SECONDS",
            help=f"refresh {what} every SECONDS (default 2) until Ctrl-C",
        )

    def watch(
        self, frame: Callable[[], tuple[list[str], bool]], *, every: float, as_json: bool = False
    ) -> None:
        """Print `frame()`'s lines every `every` seconds until it says it is done, or Ctrl-C.

        On a terminal the lines are redrawn in place; otherwise (a pipe, --json) each frame follows
        the last (JSON: one object per line, text: frames separated by a blank line)."""
        if every <= 0:
            raise CommandError(_("--watch needs a number of seconds above 0"))
        in_place = not as_json and self.stdout.isatty()
        rows = 0  # on a terminal, the rows of the frame on screen
        first = True
        try:
            while True:
                lines, done = frame()
                head = ""
                if in_place:
                    if not done:
                        lines = [
                            *lines,
                            _("every %(seconds)s s, last at %(time)s — Ctrl-C to stop")
                            % {"seconds": number(every), "time": timezone.localtime().strftime("%H:%M:%S")},
                        ]
                    head = f"\x1b[{rows}F\x1b[J" if rows else ""  # back over the last frame, clear it
                    rows = _rows(lines)
                elif not first and not as_json:
                    head = "\n"
                first = False
                # One write per frame: Ctrl-C leaves a whole frame on the screen, never half of one.
                self.stdout.write(head + "\n".join(lines) + "\n", ending="")
                self.stdout.flush()
                if done:
                    return
                time.sleep(every)
        except KeyboardInterrupt:
            if in_place:
                self.stdout.write("")  # the shell's prompt on a line of its own
        except BrokenPipeError:  # `… --watch --json | head -3`: the reader has had enough
            if self.stdout._out is sys.stdout:
                # Python flushes stdout again at exit; let that flush go nowhere, quietly.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _rows(lines: list[str]) -> int:
    """Terminal rows the lines take (a long line wraps), to move back over them."""
    width = max(shutil.get_terminal_size().columns, 1)
    return sum(max(1, math.ceil(len(line) / width)) for line in lines)


class RefusedCommand(CrmCommand):
    """A stock command (django-rq's) the product replaces: whatever its options, one line and exit 1."""

    needs = ()
    refusal = ""

    def run_from_argv(self, argv: list[str]) -> None:
        self.stderr.write(self.refusal)
        sys.exit(1)

    def handle(self, *args: Any, **options: Any) -> None:
        raise CommandError(self.refusal)
