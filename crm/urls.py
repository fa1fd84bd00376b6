import django_rq.urls
from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from campaigns import link_views, webhook_views
from crm import prometheus, tenancy, views
from runner import views as runner_views
from surveys import views as survey_views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("metrics", prometheus.view, name="prometheus-metrics"),
    path("r/<str:signed>", link_views.redirect, name="campaign-redirect"),
    path("r/<str:signed>/<int:index>", link_views.redirect, name="campaign-redirect-link"),
    path("o/<str:signed>", link_views.open_pixel, name="campaign-open"),
    path("u/<str:signed>", link_views.unsubscribe, name="campaign-unsubscribe"),
    path("s/<str:signed>", survey_views.survey, name="survey"),
    # Platform operators only (crm.tenancy): the admin login for the anonymous and non-staff, 403 for
    # an organization's members.
    path("admin/metrics", tenancy.operator_view(views.metrics), name="admin-metrics"),
    path("admin/schedules/", tenancy.operator_view(views.schedules), name="admin-schedules"),
    path("admin/queues/", include("crm.queue_urls")),
    path("admin/runner/dashboard/", RedirectView.as_view(pattern_name="admin:runner_dashboard")),
    path("admin/rq/", include((tenancy.operator_urls(django_rq.urls.urlpatterns), "django_rq"))),
    path("admin/", admin.site.urls),
    path("webhooks/whatsapp/", webhook_views.whatsapp_webhook, name="whatsapp-webhook"),
    path("anymail/", include("anymail.urls")),  # ESP tracking webhooks: campaigns.esp_tracking
    path("hooks/<slug:integration_key>/<slug:handler_key>", runner_views.hook, name="runner-hook"),
]
