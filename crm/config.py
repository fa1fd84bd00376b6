"""Reading and validating settings from the environment.

Every required or malformed setting stops start-up with an ImproperlyConfigured that names it.
"""

from __future__ import annotations

import base64
import binascii
import zoneinfo
from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured


def setting_error(name: str, problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"Setting {name}: {problem}")


def parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise setting_error(name, f"{value!r} is not a boolean (true/false)")


def parse_encryption_keys(name: str, value: str) -> list[bytes]:
    """Comma-separated url-safe base64 keys of 32 bytes (AES-256); the first one encrypts."""
    keys = []
    for i, part in enumerate(p.strip() for p in value.split(",")):
        if not part:
            continue
        try:
            key = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        except (binascii.Error, ValueError):
            raise setting_error(name, f"key #{i + 1} is not url-safe base64") from None
        if len(key) != 32:
            raise setting_error(
                name,
                f"key #{i + 1} decodes to {len(key)} bytes; AES-256 needs 32. "
                'Generate one with: python -c "import base64,os;'
                'print(base64.urlsafe_b64encode(os.urandom(32)).decode())"',
            )
        keys.append(key)
    if not keys:
        raise setting_error(name, "is empty")
    return keys


def validate_timezone(name: str, value: str) -> str:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise setting_error(name, f"{value!r} is not an IANA time zone (e.g. America/Sao_Paulo)") from None
    return value


def parse_redis_url(name: str, value: str) -> dict:
    """A django-rq connection config from redis://, rediss://, unix:// or sentinel:// URLs.

    sentinel://[:password@]host:port[,host:port...]/<master-name>[/<db>]
    """
    parsed = urlparse(value)
    if parsed.scheme in ("redis", "rediss", "unix"):
        if parsed.scheme != "unix" and not parsed.hostname:
            raise setting_error(name, f"{value!r} has no host")
        if parsed.scheme == "unix" and not parsed.path:
            raise setting_error(name, f"{value!r} has no socket path")
        return {"URL": value}
    if parsed.scheme == "sentinel":
        netloc = parsed.netloc.rsplit("@", 1)
        password = urlparse(f"x://{netloc[0]}@h").password if len(netloc) == 2 else None
        hosts = []
        for hostport in netloc[-1].split(","):
            host, _, port = hostport.partition(":")
            if not host:
                raise setting_error(name, f"sentinel host list {netloc[-1]!r} is malformed")
            try:
                hosts.append((host, int(port or 26379)))
            except ValueError:
                raise setting_error(name, f"sentinel port in {hostport!r} is not a number") from None
        parts = [p for p in parsed.path.split("/") if p]
        if not parts:
            raise setting_error(name, "sentinel URL needs the master name: sentinel://host:26379/mymaster/0")
        try:
            db = int(parts[1]) if len(parts) > 1 else 0
        except ValueError:
            raise setting_error(name, f"database {parts[1]!r} is not a number") from None
        config: dict = {"SENTINELS": hosts, "MASTER_NAME": parts[0], "DB": db}
        if password:
            config["PASSWORD"] = password
        return config
    raise setting_error(name, f"{value!r} must start with redis://, rediss://, unix:// or sentinel://")
