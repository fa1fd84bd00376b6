from __future__ import annotations

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from campaigns import selectors, services
from campaigns.models import Campaign, CampaignMetric, WhatsappMessage
from campaigns.sending import _variable


def _act(request: HttpRequest, queryset: QuerySet[Campaign], fn, done: str) -> None:
    for campaign in queryset:
        try:
            fn(campaign=campaign)
        except services.CampaignError as exc:
            messages.error(request, f"{campaign}: {exc}")
        else:
            messages.success(request, f"{campaign}: {done}")


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_display = ("name", "organization", "channel", "status", "progress", "started_at", "finished_at")
    list_select_related = ("organization", "metric")
    list_filter = ("status", "channel", "organization")
    search_fields = ("name", "template_name")
    raw_id_fields = ("audience_store",)
    readonly_fields = ("status", "started_at", "finished_at", "stop_reason", "live_status", "preview")
    actions = ["start", "cancel", "pause", "resume", "retry_failed"]
    fieldsets = (
        (None, {"fields": ("organization", "name", "channel", "status", "stop_reason")}),
        (
            _("WhatsApp template"),
            {
                "fields": (
                    "whatsapp_number",
                    "template_name",
                    "template_language",
                    "template_category",
                    "template_variables",
                    "header_image_url",
                    ("redirect_url", "redirect_button_index"),
                    "unsubscribe_button_index",
                )
            },
        ),
        (_("Audience"), {"fields": ("audience_store", "audience_purchased_within_days")}),
        (_("Progress"), {"fields": ("started_at", "finished_at", "live_status", "preview")}),
    )

    @admin.display(description=_("progress"))
    def progress(self, obj: Campaign) -> str:
        metric = getattr(obj, "metric", None)
        if metric is None or not metric.queued:
            return "—"
        done = metric.sent + metric.failed + metric.skipped
        return f"{done}/{metric.queued} ({100 * done // metric.queued}%)"

    @admin.display(description=_("live status"))
    def live_status(self, obj: Campaign) -> str:
        if not obj.pk:
            return "—"
        data = selectors.campaign_status(campaign=obj)
        rows = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", data["counts"].items())
        return format_html(
            "<table>{}<tr><th>cost</th><td>{}</td></tr><tr><th>rate</th><td>{}/s</td></tr>"
            "<tr><th>ETA</th><td>{}</td></tr></table>",
            rows,
            data["cost"],
            data["rate"],
            f"{data['eta_seconds']} s" if data["eta_seconds"] else "—",
        )

    @admin.display(description=_("preview (first recipients)"))
    def preview(self, obj: Campaign) -> str:
        if not obj.pk:
            return "—"
        customers = selectors.campaign_audience(campaign=obj).order_by("pk")[:5]
        store = obj.whatsapp_number.store.name if obj.whatsapp_number and obj.whatsapp_number.store else ""
        rows = [
            (c.name, c.phone, " | ".join(_variable(c, s, store) or "∅" for s in obj.template_variables))
            for c in customers
        ]
        return format_html(
            "<table>{}</table>", format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", rows)
        )

    @admin.action(description=_("Start (send now)"))
    def start(self, request, queryset):
        _act(request, queryset, services.campaign_start, "started")

    @admin.action(description=_("Cancel"))
    def cancel(self, request, queryset):
        _act(request, queryset, services.campaign_cancel, "cancelled")

    @admin.action(description=_("Pause"))
    def pause(self, request, queryset):
        _act(request, queryset, services.campaign_pause, "paused")

    @admin.action(description=_("Resume"))
    def resume(self, request, queryset):
        _act(request, queryset, services.campaign_resume, "resumed")

    @admin.action(description=_("Retry failed messages"))
    def retry_failed(self, request, queryset):
        _act(request, queryset, services.campaign_retry_failed, "failed messages queued again")


@admin.register(WhatsappMessage)
class WhatsappMessageAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "campaign",
        "customer",
        "phone",
        "status",
        "error_code",
        "error_reason",
        "sent_at",
        "cost",
    )
    list_select_related = ("campaign", "customer")
    list_filter = ("status", "error_code")
    search_fields = ("=phone", "=wamid", "=campaign__id")
    raw_id_fields = ("campaign", "customer", "organization")
    show_full_result_count = False
    readonly_fields = [f.name for f in WhatsappMessage._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(CampaignMetric)
class CampaignMetricAdmin(admin.ModelAdmin):
    list_display = ("campaign", "queued", "sent", "delivered", "read", "failed", "skipped", "clicked", "cost")
    list_select_related = ("campaign",)
    readonly_fields = (
        "campaign",
        "queued",
        "sent",
        "delivered",
        "read",
        "failed",
        "skipped",
        "clicked",
        "cost",
    )
