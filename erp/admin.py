from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.text import smart_split, unescape_string_literal
from django.utils.translation import gettext_lazy as _

from crm.tenancy import TenantAdmin
from erp import reasons, services
from erp.models import ErpConnection, ErpSyncIssue
from integrations.admin import WriteOnlySecretForm, https_urls, write_only_input
from integrations.errors import IntegrationError


class ErpConnectionForm(WriteOnlySecretForm):
    write_only_field, write_only_setter, write_only_column = "password", "set_password", "password_encrypted"
    password = write_only_input(_("password"))
    base_url = forms.URLField(label=_("Millennium URL"), assume_scheme="https")

    class Meta:
        formfield_callback = staticmethod(https_urls)  # URLs typed without a scheme: https
        model = ErpConnection
        fields = ["organization", "base_url", "username", "page_size", "timeout_seconds", "enabled"]


@admin.register(ErpConnection)
class ErpConnectionAdmin(TenantAdmin):
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    form = ErpConnectionForm
    list_display = (
        "organization",
        "base_url",
        "enabled",
        "customers_trans_id",
        "customers_full_synced_at",
        "sales_synced_at",
        "last_error_at",
    )
    list_select_related = ("organization",)
    list_filter = ("enabled",)
    search_fields = ("organization__name", "base_url")
    readonly_fields = (
        "customers_trans_id",
        "customers_full_day",
        "customers_full_cursor",
        "customers_full_synced_at",
        "customers_synced_at",
        "sales_synced_at",
        "last_error",
        "last_error_at",
    )
    fieldsets = (
        (None, {"fields": ("organization", "base_url", "username", "password", "enabled")}),
        (_("Paging"), {"fields": ("page_size", "timeout_seconds")}),
        (
            _("Sync state"),
            {
                "fields": readonly_fields,
                "description": _(
                    "Incremental customer syncs ask for what comes after the high-water trans_id; a full "
                    "sync in progress resumes from its position after a crash."
                ),
            },
        ),
    )
    actions = ["check_connection", "sync_customers_now", "sync_sales_today"]

    @admin.action(
        description=_("Check the connection (ask the ERP for one customer)"), permissions=["change"]
    )
    def check_connection(self, request, queryset):
        for connection in queryset.select_related("organization"):
            try:
                services.erp_connection_check(connection=connection)
            except IntegrationError as exc:
                messages.error(
                    request, _("%(org)s: %(error)s") % {"org": connection.organization, "error": exc}
                )
            else:
                messages.success(request, _("%(org)s: the ERP answered.") % {"org": connection.organization})

    @admin.action(description=_("Sync today's sales now (every store)"), permissions=["change"])
    def sync_sales_today(self, request, queryset):
        for connection in queryset.select_related("organization"):
            jobs = services.sales_sync_today(connection=connection)
            messages.info(
                request,
                _("%(org)s: sales sync of today enqueued for %(n)s store(s).")
                % {"org": connection.organization, "n": len(jobs)},
            )

    @admin.action(description=_("Enqueue today's full customer sync"), permissions=["change"])
    def sync_customers_now(self, request, queryset):
        for connection in queryset.select_related("organization"):
            job_id = services.customers_sync_enqueue(connection=connection)
            messages.info(
                request,
                _("%(org)s: %(job)s enqueued (nothing happens if it already ran today).")
                % {"org": connection.organization, "job": job_id},
            )


@admin.register(ErpSyncIssue)
class ErpSyncIssueAdmin(TenantAdmin):
    list_display = (
        "seen_at",
        "organization",
        "kind",
        "store",
        "external_id",
        "trans_id",
        "reason_shown",
        "times_seen",
    )
    list_select_related = ("organization", "store")
    list_filter = ("kind", "organization")
    search_fields = ("=external_id", "reason")  # how they are searched: get_search_results
    date_hierarchy = "seen_at"
    readonly_fields = (
        "organization",
        "store",
        "kind",
        "external_id",
        "trans_id",
        "reason_shown",
        "payload",
        "first_seen_at",
        "seen_at",
        "times_seen",
    )
    fields = readonly_fields

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """Every word, as Django's search reads the fields (the ERP id exactly, a part of the stored
        English reason) or in the reason as the list shows it: reasons are kept as message ids and
        shown in the reader's language (erp.reasons), and a manager in pt-BR searches with the words
        on the screen ("relogio" finds "…à frente do relógio…"). A word's few message ids filter the
        rows, an issue stored before the ids by its English sentence's shape."""
        found = Q()
        for bit in smart_split(search_term):
            word = unescape_string_literal(bit) if bit[0] in "\"'" and bit[0] == bit[-1] else bit
            matches = Q(external_id__iexact=word) | Q(reason__icontains=word)
            codes = reasons.codes_containing(word)
            if codes:
                matches |= Q(reason_code__in=codes)
                matches |= Q(reason_code="", reason__regex=reasons.english_pattern(codes))
            found &= matches
        return queryset.filter(found), False

    @admin.display(description=_("reason"), ordering="reason")
    def reason_shown(self, obj: ErpSyncIssue) -> str:
        return obj.reason_shown()
