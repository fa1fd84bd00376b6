"""Operational endpoints: health and the seed's per-queue metrics."""

from __future__ import annotations

import time

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from redis.exceptions import RedisError

from crm import jobs, stats


def _check(fn) -> dict:
    started = time.monotonic()
    try:
        fn()
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "ms": round((time.monotonic() - started) * 1000, 1)}


def _db() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _redis() -> None:
    jobs.get_connection().ping()


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database and Redis answer, 503 otherwise; says which failed."""
    checks = {"database": _check(_db), "redis": _check(_redis)}
    healthy = all(c["ok"] for c in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unavailable", "checks": checks}, status=200 if healthy else 503
    )


@never_cache
def metrics(request: HttpRequest) -> JsonResponse:
    """{queue: {waiting, active, failed, completed, delayed}} — staff only (mounted in the admin)."""
    try:
        return JsonResponse(stats.queue_stats())
    except RedisError as exc:
        return JsonResponse({"error": f"redis unavailable: {exc}"}, status=503)
