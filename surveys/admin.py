from __future__ import annotations

from datetime import datetime
from itertools import groupby
from zoneinfo import ZoneInfo

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from crm import tenancy
from crm.models import Organization
from crm.tenancy import TenantAdmin
from surveys import selectors, services
from surveys.models import Survey

NPS_PERIODS = (3, 6, 12, 24)  # months
NPS_DEFAULT_PERIOD = 12


def _months_back(organization: Organization, months: int) -> datetime:
    """The start of the month `months - 1` months before this one, in the organization's time zone."""
    now = timezone.now().astimezone(ZoneInfo(organization.timezone))
    index = now.year * 12 + now.month - 1 - (months - 1)
    return now.replace(
        year=index // 12, month=index % 12 + 1, day=1, hour=0, minute=0, second=0, microsecond=0
    )


@admin.register(Survey)
class SurveyAdmin(TenantAdmin):
    list_display = (
        "id",
        "sale_erp_id",
        "customer",
        "store",
        "organization",
        "channel",
        "status",
        "due_at",
        "sent_at",
        "score",
        "answered_at",
    )
    list_select_related = ("sale", "customer", "store", "organization")
    list_filter = ("status", "channel", "organization", "store")
    search_fields = ("customer__name", "=customer__email", "=sale__erp_id")
    show_full_result_count = False  # no second COUNT(*) over every survey
    list_per_page = 100
    change_list_template = "admin/surveys/survey/change_list.html"
    actions = ["send_now", "cancel"]
    fields = (
        "organization",
        "store",
        "sale",
        "customer",
        "channel",
        "status",
        "due_at",
        "attempts",
        "sending_at",
        "sent_at",
        "provider_reference",
        "reason",
        "answered_at",
        "score",
        "comment",
        "created_at",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a survey comes from a sale

    @admin.display(description=_("sale"), ordering="sale__erp_id")
    def sale_erp_id(self, obj: Survey) -> str:
        return obj.sale.erp_id

    @admin.action(description=_("Send now (scheduled surveys)"), permissions=["change"])
    def send_now(self, request: HttpRequest, queryset: QuerySet[Survey]) -> None:
        ids = list(queryset.filter(status=Survey.Status.SCHEDULED).values_list("pk", flat=True))
        sent = services.surveys_send_now(survey_ids=ids)
        messages.success(
            request,
            ngettext("%(n)d survey will be sent now.", "%(n)d surveys will be sent now.", sent) % {"n": sent},
        )

    @admin.action(description=_("Cancel (scheduled surveys)"), permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Survey]) -> None:
        ids = list(queryset.filter(status=Survey.Status.SCHEDULED).values_list("pk", flat=True))
        cancelled = services.surveys_cancel(survey_ids=ids)
        messages.success(
            request,
            ngettext("%(n)d survey cancelled.", "%(n)d surveys cancelled.", cancelled) % {"n": cancelled},
        )

    def get_urls(self) -> list[URLPattern]:
        return [
            path("nps/", self.admin_site.admin_view(self.nps_view), name="surveys_survey_nps"),
            *super().get_urls(),
        ]

    def nps_view(self, request: HttpRequest) -> TemplateResponse:
        """NPS per store and per month for one organization (staff with view permission only)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        visible = tenancy.scope(Organization.objects.all(), request.user, "pk")
        organizations = list(visible.order_by("name").values_list("pk", "name"))
        chosen = request.GET.get("organization", "")
        organization = None
        if chosen.isdigit():
            organization = visible.filter(pk=int(chosen)).first()
        elif len(organizations) == 1:
            organization = visible.filter(pk=organizations[0][0]).first()
        period = request.GET.get("months", "")
        months = int(period) if period.isdigit() and int(period) in NPS_PERIODS else NPS_DEFAULT_PERIOD
        report = []
        if organization is not None:
            rows = selectors.nps_by_store_and_month(
                organization=organization, since=_months_back(organization, months)
            )
            totals = selectors.nps_month_totals(rows)
            report = [
                {"month": month, "total": totals[month], "stores": list(stores)}
                for month, stores in groupby(rows, key=lambda r: r.month)
            ]
        context = {
            **self.admin_site.each_context(request),
            "title": _("NPS by store and month"),
            "opts": self.model._meta,
            "organizations": organizations,
            "organization": organization,
            "periods": NPS_PERIODS,
            "months": months,
            "report": report,
        }
        return TemplateResponse(request, "admin/surveys/survey/nps.html", context)
