"""The queue pages (BullBoard's replacement) in the admin: thin views over crm.queue_ops.

Every view is mounted through `crm.tenancy.operator_view` (platform operators only, CSRF protected,
never cached);
actions are POST only and redirect back with a message.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext
from django.views.decorators.http import require_http_methods, require_POST

from crm import queue_actions, queue_ops

STATE_LABELS = {
    "waiting": gettext_lazy("waiting"),
    "active": gettext_lazy("active"),
    "delayed": gettext_lazy("delayed"),
    "completed": gettext_lazy("completed"),
    "failed": gettext_lazy("failed"),
}
BULK_LABELS = {
    "retry-all": gettext_lazy("Retry all"),
    "delete-all": gettext_lazy("Delete all"),
    "empty": gettext_lazy("Empty the queue"),
    "promote-all": gettext_lazy("Run all now"),
}
ACTION_LABELS = {
    "retry": gettext_lazy("Retry"),
    "promote": gettext_lazy("Run now"),
    "cancel": gettext_lazy("Cancel"),
    "delete": gettext_lazy("Delete"),
}


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = int(seconds)
    for unit, size, sub_unit, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            rest = (s % size) // sub_size
            return f"{s // size}{unit} {rest}{sub_unit}" if rest else f"{s // size}{unit}"
    return f"{s}s"


def _check(queue: str, state: str | None = None) -> None:
    if not queue_ops.is_queue(queue) or (state is not None and state not in queue_ops.STATES):
        raise Http404(_("No such queue or state."))


def overview(request: HttpRequest) -> HttpResponse:
    """Every queue in worker order with its counts and workers; `?format=json` for the refresh."""
    rows = queue_ops.overview()
    for row in rows:
        row["oldest_waiting"] = _age(row["oldest_waiting_seconds"])
    if request.GET.get("format") == "json":
        return JsonResponse({"queues": rows})
    for row in rows:
        row["cells"] = [
            (state, row[state], reverse("admin-queue-jobs", args=[row["name"], state]))
            for state in queue_ops.STATES
        ]
    context = {
        **admin.site.each_context(request),
        "title": _("Queues"),
        "rows": rows,
        "state_labels": [STATE_LABELS[s] for s in queue_ops.STATES],
        "json_url": f"{request.path}?format=json",
    }
    return TemplateResponse(request, "admin/queues/overview.html", context)


def _page_number(value: str | None) -> int:
    try:
        return max(int(value or 1), 1)
    except ValueError:
        return 1


def job_list(request: HttpRequest, queue: str, state: str) -> HttpResponse:
    """A page of a queue's jobs in one state, optionally searched by id or argument value."""
    _check(queue, state)
    query = request.GET.get("q", "")[:200]
    page = queue_ops.list_jobs(queue, state, page=_page_number(request.GET.get("page")), query=query)

    def page_url(number: int) -> str:
        params: dict[str, Any] = {"page": number}
        if page.query:
            params["q"] = page.query
        return f"{request.path}?{urlencode(params)}"

    context = {
        **admin.site.each_context(request),
        "title": _("%(queue)s: %(state)s") % {"queue": queue, "state": STATE_LABELS[state]},
        "queue": queue,
        "state": state,
        "state_label": STATE_LABELS[state],
        "states": [
            (s, STATE_LABELS[s], reverse("admin-queue-jobs", args=[queue, s])) for s in queue_ops.STATES
        ],
        "page": page,
        "tenants": queue_ops.tenants(queue),
        "previous_url": page_url(page.page - 1) if page.page > 1 else "",
        "next_url": page_url(page.page + 1) if page.page < page.pages else "",
        "search_limit": queue_ops.SEARCH_LIMIT,
        "bulk": [
            (BULK_LABELS[action], reverse("admin-queue-bulk", args=[queue, state, action]))
            for action, on in queue_ops.BULK_ACTIONS.items()
            if on == state
        ],
    }
    return TemplateResponse(request, "admin/queues/jobs.html", context)


# RQ's job statuses as the operator reads them.
STATUS_LABELS = {
    "queued": gettext_lazy("waiting"),
    "started": gettext_lazy("running"),
    "scheduled": gettext_lazy("delayed"),
    "deferred": gettext_lazy("waiting for another job"),
    "finished": gettext_lazy("completed"),
    "failed": gettext_lazy("failed"),
    "stopped": gettext_lazy("stopped"),
    "canceled": gettext_lazy("canceled"),
    "created": gettext_lazy("created"),
}


def job_detail(request: HttpRequest, job_id: str) -> HttpResponse:
    """One job: arguments, metadata, times, attempts, result or traceback, and its actions."""
    job = queue_ops.job_detail(job_id)
    if job is None:
        raise Http404(_("No job %(id)s.") % {"id": job_id})
    back = (
        reverse("admin-queue-jobs", args=[job.origin, job.state])
        if job.state and queue_ops.is_queue(job.origin)
        else reverse("admin-queues")
    )
    context = {
        **admin.site.each_context(request),
        "title": _("Job %(id)s") % {"id": job.id},
        "job": job,
        "status_label": STATUS_LABELS.get(str(getattr(job.status, "value", job.status)), job.status),
        "back_url": back,
        "actions": [
            (action, ACTION_LABELS[action], reverse("admin-queue-job-action", args=[job.id, action]))
            for action in job.actions
        ],
    }
    return TemplateResponse(request, "admin/queues/job.html", context)


def _back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = default
    return HttpResponseRedirect(target)


_WRONG_STATE = {
    "retry": gettext_lazy("Only a failed job can be retried; job %(id)s is %(status)s."),
    "promote": gettext_lazy("Only a delayed job can be run now; job %(id)s is %(status)s."),
    "cancel": gettext_lazy("Only a waiting job can be canceled; job %(id)s is %(status)s."),
    "delete": gettext_lazy("Job %(id)s could not be deleted: it is %(status)s."),
}


@require_POST
def job_action(request: HttpRequest, job_id: str, action: str) -> HttpResponse:
    """retry / delete / promote / cancel one job, then back to where the form was."""
    if action not in queue_ops.JOB_ACTIONS:
        raise Http404(_("No such action."))
    detail = reverse("admin-queue-job", args=[job_id])
    values = {"id": job_id}
    try:
        if action == "retry":
            queue, attempts = queue_actions.job_retry(job_id)
            text = ngettext(
                "Job %(id)s is back on %(queue)s with %(attempts)s attempt.",
                "Job %(id)s is back on %(queue)s with %(attempts)s attempts.",
                attempts,
            ) % {**values, "queue": queue, "attempts": attempts}
        elif action == "promote":
            queue = queue_actions.job_promote(job_id)
            text = _("Job %(id)s is on %(queue)s to run now.") % {**values, "queue": queue}
        elif action == "cancel":
            queue = queue_actions.job_cancel(job_id)
            text = _("Job %(id)s was canceled and taken off %(queue)s.") % {**values, "queue": queue}
        else:
            queue = queue_actions.job_delete(job_id)
            text = _("Job %(id)s was deleted from %(queue)s.") % {**values, "queue": queue}
            detail = reverse("admin-queues")
    except queue_ops.JobGone:
        messages.error(request, _("Job %(id)s no longer exists.") % values)
        return _back(request, reverse("admin-queues"))
    except queue_ops.WrongState as exc:
        status = STATUS_LABELS.get(exc.status, exc.status)
        messages.error(request, _WRONG_STATE[action] % {**values, "status": status})
        return _back(request, detail)
    messages.success(request, text)
    return _back(request, detail)


def _question(action: str, count: int, queue: str) -> str:
    values = {"count": count, "queue": queue}
    if action == "retry-all":
        text = ngettext(
            "Retry the %(count)s failed job of %(queue)s?",
            "Retry all %(count)s failed jobs of %(queue)s?",
            count,
        )
    elif action == "delete-all":
        text = ngettext(
            "Delete the %(count)s failed job of %(queue)s?",
            "Delete all %(count)s failed jobs of %(queue)s?",
            count,
        )
    elif action == "empty":
        text = ngettext(
            "Remove the %(count)s waiting job of %(queue)s?",
            "Remove all %(count)s waiting jobs of %(queue)s?",
            count,
        )
    else:
        text = ngettext(
            "Run the %(count)s delayed job of %(queue)s now?",
            "Run all %(count)s delayed jobs of %(queue)s now?",
            count,
        )
    return text % values


def _done(action: str, count: int, queue: str) -> str:
    values = {"count": count, "queue": queue}
    if action == "retry-all":
        text = ngettext(
            "%(count)s failed job of %(queue)s is back on its queue.",
            "%(count)s failed jobs of %(queue)s are back on their queue.",
            count,
        )
    elif action == "delete-all":
        text = ngettext(
            "%(count)s failed job of %(queue)s deleted.", "%(count)s failed jobs of %(queue)s deleted.", count
        )
    elif action == "empty":
        text = ngettext(
            "%(count)s waiting job removed from %(queue)s.",
            "%(count)s waiting jobs removed from %(queue)s.",
            count,
        )
    else:
        text = ngettext(
            "%(count)s delayed job of %(queue)s is on its queue to run now.",
            "%(count)s delayed jobs of %(queue)s are on their queue to run now.",
            count,
        )
    return text % values


@require_http_methods(["GET", "POST"])
def bulk(request: HttpRequest, queue: str, state: str, action: str) -> HttpResponse:
    """GET: a confirmation naming how many jobs; POST: do it, in batches."""
    _check(queue, state)
    if queue_ops.BULK_ACTIONS.get(action) != state:
        raise Http404(_("No such action."))
    back = reverse("admin-queue-jobs", args=[queue, state])
    if request.method == "POST":
        # At most what the confirmation named: jobs that arrived since are left alone.
        confirmed = request.POST.get("count", "")
        done = queue_actions.bulk_run(queue, action, limit=int(confirmed) if confirmed.isdigit() else None)
        messages.success(request, _done(action, done, queue))
        return HttpResponseRedirect(back)
    count = queue_actions.bulk_count(queue, action)
    context = {
        **admin.site.each_context(request),
        "title": _question(action, count, queue),
        "queue": queue,
        "state": state,
        "state_label": STATE_LABELS[state],
        "action": action,
        "action_label": BULK_LABELS[action],
        "count": count,
        "back_url": back,
        "waiting_on_dependency": queue_actions.state_sizes(queue)["deferred"]
        if action == "promote-all"
        else 0,
    }
    return TemplateResponse(request, "admin/queues/confirm.html", context)
