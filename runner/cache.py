"""Integration types, handler configs and tenant limits cached in Redis (get-or-fetch, 60 s TTL),
read by every item job in one MGET and invalidated when edited (post_save / post_delete).

Secrets are never cached in Redis: an HTTP handler's auth value is read from the database by the
job. The webhook intake keeps each handler with its webhook secret in its own process memory for
WEBHOOK_HANDLER_TTL (`webhook_handler`), so a webhook costs no read of the handler.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.db.models.signals import post_delete, post_save

from crm import jobs
from runner import conf
from runner.models import DEFAULT_TENANT_LIMIT, Handler, IntegrationType, RunnerSettings

if TYPE_CHECKING:
    from runner.models import Handler

PREFIX = "runner:cache:"
# A disabled integration or a new webhook secret reaches every web process within this time (at
# once in the process that saved it).
WEBHOOK_HANDLER_TTL = 5.0
_WEBHOOK_HANDLERS_MAX = 1000
_webhook_handlers: dict[tuple[str, str], tuple[float, Handler, str]] = {}
_webhook_handlers_lock = threading.Lock()


def webhook_handler(integration_key: str, handler_key: str) -> tuple[Handler | None, str]:
    """The handler (with its integration) and its webhook secret, from this process's cache."""
    key = (integration_key, handler_key)
    hit = _webhook_handlers.get(key)
    if hit is not None and time.monotonic() - hit[0] < WEBHOOK_HANDLER_TTL:
        return hit[1], hit[2]
    # One thread reads while the others wait for it: a burst on a cold cache must not open a
    # database connection per web thread.
    with _webhook_handlers_lock:
        hit = _webhook_handlers.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < WEBHOOK_HANDLER_TTL:
            return hit[1], hit[2]
        return _webhook_handler_read(key, now)


def _webhook_handler_read(key: tuple[str, str], now: float) -> tuple[Handler | None, str]:

    integration_key, handler_key = key
    handler = (
        Handler.objects.select_related("integration")
        .filter(integration__integration_key=integration_key, handler_key=handler_key)
        .first()
    )
    if not connection.in_atomic_block:
        # Web threads write through the inbox's group commit: this thread's connection would
        # otherwise stay open (CONN_MAX_AGE) for a read it makes once in a while.
        connection.close()
    if handler is None:
        _webhook_handlers.pop(key, None)
        return None, ""
    secret = handler.webhook_secret()
    if len(_webhook_handlers) >= _WEBHOOK_HANDLERS_MAX:
        _webhook_handlers.clear()
    _webhook_handlers[key] = (now, handler, secret)
    return handler, secret


def _type_key(integration_key: str) -> str:
    return f"{PREFIX}types:{integration_key}"


def _handler_key(integration_key: str, handler_key: str) -> str:
    return f"{PREFIX}handlers:{integration_key}:{handler_key}"


def _org_key(organization_id: int) -> str:
    return f"{PREFIX}orgs:{organization_id}"


def _fetch_type(integration_key: str) -> dict[str, Any] | None:

    it = (
        IntegrationType.objects.filter(integration_key=integration_key)
        .values("id", "enabled", "name")
        .first()
    )
    return dict(it) if it else None


def _fetch_handler(integration_key: str, handler_key: str) -> dict[str, Any] | None:

    h = (
        Handler.objects.filter(integration__integration_key=integration_key, handler_key=handler_key)
        .values(
            "id",
            "integration_id",
            "organization_id",
            "direction",
            "kind",
            "callable_path",
            "endpoint_url",
            "auth_header",
            "concurrency",
            "rate_limit_per_minute",
            "batch_size",
            "paused",
        )
        .first()
    )
    return dict(h) if h else None


def _fetch_org(organization_id: int) -> dict[str, Any]:

    limit = (
        RunnerSettings.objects.filter(organization_id=organization_id)
        .values_list("rate_limit_per_minute", flat=True)
        .first()
    )
    return {"rate_limit_per_minute": limit or DEFAULT_TENANT_LIMIT}


def load(
    integration_key: str, handler_key: str, organization_id: int
) -> tuple[dict | None, dict | None, dict]:
    """(integration type, handler config, tenant settings): one Redis round trip when cached."""
    keys = [_type_key(integration_key), _handler_key(integration_key, handler_key), _org_key(organization_id)]
    connection = jobs.get_connection()
    raw = connection.mget(keys)
    values: list[Any] = [json.loads(r) if r is not None else None for r in raw]
    ttl = int(conf.get("RUNNER_CACHE_TTL"))
    missing: dict[str, Any] = {}
    if raw[0] is None:
        values[0] = missing[keys[0]] = _fetch_type(integration_key) or {}
    if raw[1] is None:
        values[1] = missing[keys[1]] = _fetch_handler(integration_key, handler_key) or {}
    if raw[2] is None:
        values[2] = missing[keys[2]] = _fetch_org(organization_id)
    if missing:
        with connection.pipeline(transaction=False) as pipe:
            for key, value in missing.items():
                pipe.set(key, json.dumps(value), ex=ttl)
            pipe.execute()
    # An empty dict is a cached "does not exist" (so a deleted handler costs no query per item).
    return values[0] or None, values[1] or None, values[2]


def invalidate(
    *, integration_key: str = "", handler_key: str = "", organization_id: int | None = None
) -> None:
    keys = []
    if integration_key and handler_key:
        keys.append(_handler_key(integration_key, handler_key))
    elif integration_key:
        keys.append(_type_key(integration_key))
    if organization_id is not None:
        keys.append(_org_key(organization_id))
    if keys:
        jobs.get_connection().delete(*keys)


def _type_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    _webhook_handlers.clear()
    invalidate(integration_key=instance.integration_key)


def _handler_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    _webhook_handlers.clear()

    ik = (
        IntegrationType.objects.filter(pk=instance.integration_id)
        .values_list("integration_key", flat=True)
        .first()
    )
    if ik:
        invalidate(integration_key=ik, handler_key=instance.handler_key)
    old = getattr(instance, "_loaded_handler_key", None)
    if ik and old and old != instance.handler_key:
        invalidate(integration_key=ik, handler_key=old)


def _settings_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    invalidate(organization_id=instance.organization_id)


def connect_signals() -> None:

    for signal in (post_save, post_delete):
        signal.connect(_type_changed, sender=IntegrationType, dispatch_uid=f"runner.cache.type.{signal}")
        signal.connect(_handler_changed, sender=Handler, dispatch_uid=f"runner.cache.handler.{signal}")
        signal.connect(_settings_changed, sender=RunnerSettings, dispatch_uid=f"runner.cache.org.{signal}")
