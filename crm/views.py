"""Operational endpoints: health, the seed's per-queue metrics and the cron schedules page."""

from __future__ import annotations

import time

from django.contrib import admin, messages
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from redis.exceptions import RedisError
from rq import Worker
from rq.serializers import JSONSerializer

from crm import cron, jobs, stats, tenancy


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


def _background() -> dict:
    """Workers and schedulers alive, and how long the oldest waiting job has waited (seconds)."""
    connection = jobs.get_connection()
    workers = Worker.all(connection=connection, serializer=JSONSerializer)
    schedulers = [
        key
        for key in connection.scan_iter(f"{cron.CrmScheduler.redis_scheduler_namespace_prefix}*", count=100)
        if not connection.hexists(key, "death")
    ]
    oldest = {name: round(age, 1) for name, age in stats.oldest_waiting().items()}
    return {
        "workers": {"ok": bool(workers), "alive": len(workers)},
        "scheduler": {"ok": bool(schedulers), "alive": len(schedulers)},
        "oldest_waiting_seconds": {"ok": True, "max": max(oldest.values(), default=0.0), "by_queue": oldest},
    }


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database and Redis answer, 503 otherwise; says which failed.

    Also reports the workers and schedulers alive and the oldest waiting job's age. Those decide
    the status only with `?full=1` (a web node must not leave the load balancer because the
    workers are down; a monitor asking for the whole platform wants to know). The errors' text
    (which names hosts and ports) is shown to platform operators only; anyone else learns which
    check failed."""
    checks = {"database": _check(_db), "redis": _check(_redis)}
    if checks["redis"]["ok"]:
        try:
            checks.update(_background())
        except RedisError as exc:
            checks["redis"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    deciding = checks if request.GET.get("full") == "1" else {k: checks[k] for k in ("database", "redis")}
    healthy = all(c["ok"] for c in deciding.values())
    if not tenancy.is_operator(request.user):
        for check in checks.values():
            check.pop("error", None)
    return JsonResponse(
        {"status": "ok" if healthy else "unavailable", "checks": checks}, status=200 if healthy else 503
    )


@never_cache
def metrics(request: HttpRequest) -> JsonResponse:
    """{queue: {waiting, active, failed, completed, delayed}} — platform operators only (project.urls)."""
    try:
        return JsonResponse(stats.queue_stats())
    except RedisError as exc:
        return JsonResponse({"error": f"redis unavailable: {exc}"}, status=503)


@never_cache
def schedules(request: HttpRequest) -> HttpResponse:
    """The cron table with each entry's next run; POST name=… runs one now (operators only: project.urls)."""
    if request.method == "POST":
        name = request.POST.get("name", "")
        if name not in cron.cron_table():
            messages.error(request, _("No cron entry %(name)s.") % {"name": name})
        else:
            job_id = cron.cron_fire(name, manual=True)
            messages.success(request, _("%(name)s enqueued as %(job)s.") % {"name": name, "job": job_id})
        return HttpResponseRedirect(request.path)
    try:
        rows = cron.cron_schedule()
        scheduler_error = ""
    except RedisError as exc:
        rows = [{**vars(e), "next_run": None} for e in cron.cron_table().values()]
        scheduler_error = str(exc)
    table = cron.cron_table()
    for row in rows:
        # What the expression says, whether or not a scheduler has registered the entry yet.
        row["next_by_cron"] = table[row["name"]].next_runs(1)[0]
    context = {
        **admin.site.each_context(request),
        "title": _("Schedules"),
        "rows": rows,
        "scheduler_error": scheduler_error,
    }
    return TemplateResponse(request, "admin/schedules.html", context)
