"""The queue pages (BullBoard's replacement) under /admin/queues/, staff only."""

from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, path

from crm import queue_views

# admin_view: staff only (anyone else is sent to the admin login), CSRF protected, never cached.
# The job routes come first: "jobs" is not a queue name.
urlpatterns: list[URLPattern] = [
    path("", admin.site.admin_view(queue_views.overview), name="admin-queues"),
    path("jobs/<str:job_id>/", admin.site.admin_view(queue_views.job_detail), name="admin-queue-job"),
    path(
        "jobs/<str:job_id>/<str:action>/",
        admin.site.admin_view(queue_views.job_action),
        name="admin-queue-job-action",
    ),
    path("<str:queue>/<str:state>/", admin.site.admin_view(queue_views.job_list), name="admin-queue-jobs"),
    path(
        "<str:queue>/<str:state>/<str:action>/",
        admin.site.admin_view(queue_views.bulk),
        name="admin-queue-bulk",
    ),
]
