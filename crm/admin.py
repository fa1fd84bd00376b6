from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from crm.models import Customer, InboxEvent, JobRun, Organization, Sale, Store

admin.site.site_header = _("CRM — operations")
admin.site.site_title = _("CRM")


class StoreInline(admin.TabularInline):
    model = Store
    extra = 0
    fields = ("erp_code", "name")


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "slug",
        "timezone",
        "message_limit_count",
        "message_limit_days",
        "block_multiple_campaigns",
        "whatsapp_paused_at",
        "email_paused_at",
        "survey_channel",
        "created_at",
    )
    search_fields = ("name", "slug")
    list_filter = ("timezone", "block_multiple_campaigns")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [StoreInline]
    fieldsets = (
        (None, {"fields": ("name", "slug", "timezone")}),
        (
            _("Campaign settings"),
            {"fields": ("message_limit_count", "message_limit_days", "block_multiple_campaigns")},
        ),
        (
            _("WhatsApp sending"),
            {
                "fields": ("whatsapp_paused_at", "whatsapp_paused_reason"),
                "description": _(
                    "Set when Meta rejects the account itself (expired token, locked or unpaid account). "
                    "Fix the cause, then clear both fields and save: waiting campaigns resume in a minute."
                ),
            },
        ),
        (
            _("Email sending"),
            {
                "fields": ("email_paused_at", "email_paused_reason"),
                "description": _(
                    "Set when the organization's mail server refuses the account (login, TLS, relay, "
                    "connection). Recipients are left untouched meanwhile. Fix the email settings (the "
                    "'send a test email' action shows the server's answer), then clear both fields and "
                    "save: waiting campaigns resume in a minute."
                ),
            },
        ),
        (
            _("Post-sale surveys"),
            {
                "fields": (
                    "survey_channel",
                    "survey_delay_days",
                    "survey_cooldown_days",
                    "survey_whatsapp_template",
                )
            },
        ),
    )

    def get_urls(self) -> list:
        from django.urls import path

        return [
            path(
                "<int:pk>/dashboard/",
                self.admin_site.admin_view(self.dashboard_view),
                name="crm_organization_dashboard",
            ),
            *super().get_urls(),
        ]

    def dashboard_view(self, request: HttpRequest, pk: int):
        """The organization's last 30 days: campaigns, sends per day, NPS, paused sending."""
        from django.core.exceptions import PermissionDenied
        from django.http import Http404
        from django.template.response import TemplateResponse

        from campaigns import dashboards

        organization = Organization.objects.filter(pk=pk).first()
        if organization is None:
            raise Http404
        if not self.has_view_permission(request, organization):
            raise PermissionDenied
        board = dashboards.organization_dashboard(organization=organization)
        context = {
            **self.admin_site.each_context(request),
            "title": _("%(organization)s: last %(days)d days")
            % {"organization": organization.name, "days": dashboards.DASHBOARD_DAYS},
            "opts": self.model._meta,
            "original": organization,
            "board": board,
            "max_campaigns": dashboards.DASHBOARD_MAX_CAMPAIGNS,
            "chart": {
                "time_zone": organization.timezone,
                "days": [row["day"].isoformat() for row in board.days],
                "whatsapp_sent": [row["whatsapp_sent"] for row in board.days],
                "email_sent": [row["email_sent"] for row in board.days],
                "labels": {
                    "day": str(_("day")),
                    "whatsapp_sent": str(_("WhatsApp sent")),
                    "email_sent": str(_("emails sent")),
                },
            },
        }
        return TemplateResponse(request, "admin/crm/organization/dashboard.html", context)


@admin.register(Store)
class StoreAdmin(admin.ModelAdmin):
    list_display = ("erp_code", "name", "organization", "created_at")
    list_select_related = ("organization",)
    search_fields = ("erp_code", "name")
    list_filter = ("organization",)


class OptOutFilter(admin.SimpleListFilter):
    title = _("marketing opt-out")
    parameter_name = "opted_out"

    def lookups(self, request, model_admin):
        return [
            ("whatsapp", _("opted out of WhatsApp")),
            ("email", _("opted out of email")),
            ("none", _("receives both")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "whatsapp":
            return queryset.filter(whatsapp_opted_out_at__isnull=False)
        if self.value() == "email":
            return queryset.filter(email_opted_out_at__isnull=False)
        if self.value() == "none":
            return queryset.filter(whatsapp_opted_out_at__isnull=True, email_opted_out_at__isnull=True)
        return queryset


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "email",
        "phone",
        "erp_id",
        "organization",
        "marketing_consent",
        "whatsapp_opted_out_at",
        "email_opted_out_at",
    )
    list_select_related = ("organization",)
    search_fields = ("name", "=email", "=phone", "=erp_id", "=cpf_cnpj")
    list_filter = ("organization", "marketing_consent", OptOutFilter)
    show_full_result_count = False  # no second COUNT(*) over a million rows
    readonly_fields = ("created_at", "updated_at", "erp_trans_id", "erp_registered_at")
    fieldsets = (
        (None, {"fields": ("organization", "erp_id", "name", "cpf_cnpj", "email", "phone")}),
        (
            _("Consent and opt-out"),
            {
                "fields": (
                    "marketing_consent",
                    "consent_at",
                    ("whatsapp_opted_out_at", "whatsapp_opt_out_source"),
                    ("email_opted_out_at", "email_opt_out_source"),
                )
            },
        ),
        (_("Record"), {"fields": ("created_at", "updated_at", "erp_trans_id", "erp_registered_at")}),
    )


@admin.register(Sale)
class SaleAdmin(admin.ModelAdmin):
    list_display = ("erp_id", "sold_at", "total", "store", "customer", "organization")
    list_select_related = ("store", "customer", "organization")
    search_fields = ("=erp_id", "customer__name", "=customer__email")
    list_filter = ("organization", "store")
    date_hierarchy = "sold_at"
    raw_id_fields = ("customer", "store")
    show_full_result_count = False
    readonly_fields = ("items", "erp_trans_id")  # as the ERP sent them


@admin.register(JobRun)
class JobRunAdmin(admin.ModelAdmin):
    list_display = (
        "kind",
        "key",
        "status",
        "attempts",
        "started_at",
        "finished_at",
        "duration",
        "organization",
    )
    list_select_related = ("organization",)
    list_filter = ("status", "kind")
    search_fields = ("kind", "key", "job_id")
    readonly_fields = [f.name for f in JobRun._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(InboxEvent)
class InboxEventAdmin(admin.ModelAdmin):
    """Accepted webhook events not applied yet, and those set aside (their handler refused them
    alone: `error` says why). Read-only; deleting a set-aside event forgets it."""

    list_display = ("id", "kind", "organization_id", "received_at", "failed_at")
    list_filter = ("kind",)
    readonly_fields = [f.name for f in InboxEvent._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: InboxEvent | None = None) -> bool:
        return False
