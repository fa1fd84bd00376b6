"""The queue pages (BullBoard's replacement) under /admin/queues/, platform operators only."""

from __future__ import annotations

from django.urls import URLPattern, path

from crm import queue_views
from crm.tenancy import operator_view

# operator_view: the admin login for the anonymous and non-staff, 403 for members who are not
# platform operators; CSRF protected, never cached.
# The job routes come first: "jobs" is not a queue name.
urlpatterns: list[URLPattern] = [
    path("", operator_view(queue_views.overview), name="admin-queues"),
    path("jobs/<str:job_id>/", operator_view(queue_views.job_detail), name="admin-queue-job"),
    path(
        "jobs/<str:job_id>/<str:action>/",
        operator_view(queue_views.job_action),
        name="admin-queue-job-action",
    ),
    path("<str:queue>/<str:state>/", operator_view(queue_views.job_list), name="admin-queue-jobs"),
    path(
        "<str:queue>/<str:state>/<str:action>/",
        operator_view(queue_views.bulk),
        name="admin-queue-bulk",
    ),
]
