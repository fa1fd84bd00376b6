"""Start-up refuses a missing or malformed setting and says which one."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from crm import config
from tests.conftest import ROOT


def _check(*args: str, **overrides: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return subprocess.run(
        [sys.executable, "manage.py", "check", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"SECRET_KEY": ""}, "SECRET_KEY"),
        ({"SECRET_KEY": "short"}, "SECRET_KEY"),
        ({"ENCRYPTION_KEY": ""}, "ENCRYPTION_KEY"),
        ({"ENCRYPTION_KEY": "not-32-bytes"}, "ENCRYPTION_KEY"),
        ({"ENCRYPTION_OLD_KEYS": "%%%"}, "ENCRYPTION_OLD_KEYS"),
        ({"DATABASE_URL": "mysql://x@localhost/db"}, "DATABASE_URL"),
        ({"REDIS_URL": "http://localhost:6379"}, "REDIS_URL"),
        ({"TIME_ZONE": "America/Atlantis"}, "TIME_ZONE"),
        ({"LANGUAGE_CODE": "xx"}, "LANGUAGE_CODE"),
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT"),
    ],
)
def test_it_refuses_to_start_and_names_the_bad_setting(overrides, named):
    result = _check(**overrides)
    assert result.returncode == 2, result.stderr
    assert f"Setting {named}" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_documented_production_configuration_passes_the_deploy_checks():
    result = _check(
        "--deploy",
        "--fail-level",
        "WARNING",
        DEBUG="false",
        BEHIND_TLS_PROXY="true",
        SECRET_KEY=secrets.token_urlsafe(48),
        ALLOWED_HOSTS="crm.example.com.br",
    )
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_behind_a_tls_proxy_plain_http_is_redirected_but_health_probes_are_not(settings, client):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    admin = client.get("/admin/login/")
    assert admin.status_code == 301 and admin["Location"].startswith("https://")
    assert client.get("/admin/login/", headers={"X-Forwarded-Proto": "https"}).status_code == 200
    assert client.get("/healthz").status_code in (200, 503)  # answered over http, not redirected


def test_it_starts_with_valid_settings():
    result = _check()
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_sentinel_urls_become_django_rq_sentinel_configs():
    conf = config.parse_redis_url("REDIS_URL", "sentinel://:pw@s1:26379,s2/mymaster/3")
    assert conf == {
        "SENTINELS": [("s1", 26379), ("s2", 26379)],
        "MASTER_NAME": "mymaster",
        "DB": 3,
        "PASSWORD": "pw",
    }
    with pytest.raises(Exception, match="master name"):
        config.parse_redis_url("REDIS_URL", "sentinel://s1:26379")


def test_encryption_keys_accept_a_rotation_list():
    import base64

    k1, k2 = (base64.urlsafe_b64encode(bytes([i]) * 32).decode() for i in (1, 2))
    assert config.parse_encryption_keys("ENCRYPTION_KEY", f"{k1}, {k2}") == [bytes([1]) * 32, bytes([2]) * 32]
