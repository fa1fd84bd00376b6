from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from campaigns import esp_views, link_views, webhook_views
from crm import prometheus, rq_dashboard, tenancy, views
from integrations.email import tracking
from messaging import views as messaging_views
from runner import views as runner_views
from surveys import views as survey_views

urlpatterns = [
    # The webhook intakes first: a burst of them resolves its URL in a few matches.
    path("webhooks/whatsapp/", webhook_views.whatsapp_webhook, name="whatsapp-webhook"),
    path("webhooks/chatwoot/<str:token>/", messaging_views.chatwoot_webhook, name="chatwoot-webhook"),
    # ESP tracking webhooks (campaigns.esp_views): only the providers an organization can send
    # through, each authenticated; the organization's URL carries its account's signing key.
    re_path(
        rf"^anymail/(?P<provider>{'|'.join(tracking.PROVIDERS)})/tracking/(?P<organization_id>[0-9]{{1,18}})/$",
        esp_views.esp_tracking_webhook,
        name="esp-tracking-organization",
    ),
    *(
        path(
            f"anymail/{p}/tracking/",
            esp_views.esp_tracking_webhook,
            {"provider": p},
            name=f"esp-tracking-{p}",
        )
        for p in ("postmark", "sendgrid", "brevo")  # they sign nothing: basic auth alone, as before
    ),
    path("hooks/<slug:integration_key>/<slug:handler_key>", runner_views.hook, name="runner-hook"),
    path("", RedirectView.as_view(pattern_name="admin:index"), name="home"),  # the admin is the UI
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
    path("admin/rq/", include((tenancy.operator_urls(rq_dashboard.urlpatterns()), "django_rq"))),
    path("admin/", admin.site.urls),
]
