from django.contrib import admin
from django.urls import include, path

from crm import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    # Staff only: admin_view sends anyone else to the admin login.
    path("admin/metrics", admin.site.admin_view(views.metrics), name="admin-metrics"),
    path("admin/rq/", include("django_rq.urls")),
    path("admin/", admin.site.urls),
]
