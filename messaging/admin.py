from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from crm.tenancy import TenantAdmin
from messaging.models import EmailSuppression


@admin.register(EmailSuppression)
class EmailSuppressionAdmin(TenantAdmin):
    list_display = ("email", "organization", "reason", "detail", "created_at")
    list_select_related = ("organization",)
    list_filter = ("reason", "organization")
    search_fields = ("=email",)
    show_full_result_count = False

    def save_model(self, request: HttpRequest, obj: EmailSuppression, form, change: bool) -> None:
        obj.email = obj.email.strip().lower()
        super().save_model(request, obj, form, change)
