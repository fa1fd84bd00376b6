"""The customer segments' admin list."""

from __future__ import annotations

from datetime import date
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.formats import date_format
from django.utils.translation import gettext_lazy as _

from campaigns import segments
from campaigns.admin.big_tables import CappedCountPaginator
from campaigns.models import (
    CustomerSegment,
    SegmentMovement,
)
from campaigns.tasks import segments_snapshot_enqueue
from crm import tenancy
from crm.models import Organization
from crm.tenancy import TenantAdmin


class SegmentDayFilter(admin.SimpleListFilter):
    """The snapshot day: the newest unless another is chosen (never every day at once)."""

    title = _("day")
    parameter_name = "day"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        org = request.GET.get("organization__id__exact", "")
        visible = tenancy.organization_ids(request.user)
        if org.isdigit() and (visible is None or int(org) in visible):
            visible = {int(org)}
        days = segments.segment_days(organization_ids=visible)
        return [(d.isoformat(), date_format(d, "SHORT_DATE_FORMAT")) for d in days]

    def value(self) -> str | None:
        chosen = super().value()
        return chosen or (str(self.lookup_choices[0][0]) if self.lookup_choices else None)

    def choices(self, changelist: Any):
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset.none()
        try:
            return queryset.filter(day=date.fromisoformat(value))
        except ValueError:
            raise IncorrectLookupParameters(f"day {value[:40]!r}") from None


@admin.register(CustomerSegment)
class CustomerSegmentAdmin(TenantAdmin):
    """Read-only: customers per organization, day and segment; the overview has the counts and movement."""

    list_display = (
        "customer",
        "organization",
        "day",
        "segment",
        "recency_days",
        "frequency",
        "monetary",
        "rfm",
    )
    list_select_related = ("customer", "organization")
    list_filter = ("organization", SegmentDayFilter, "segment")
    # The order of the unique index (organization, day, customer), read backwards: a page is an
    # index range scan, never a sort of the day's rows. Column sorting would force one.
    ordering = ("-organization_id", "-day", "-customer_id")
    sortable_by = ()
    show_full_result_count = False
    paginator = CappedCountPaginator
    list_per_page = 100
    actions = None
    change_list_template = "admin/campaigns/customersegment/change_list.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("R F M"))
    def rfm(self, obj: CustomerSegment) -> str:
        if obj.r_score is None:
            return "—"
        return f"{obj.r_score} {obj.f_score} {obj.m_score}"

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "overview/",
                self.admin_site.admin_view(self.overview_view),
                name="campaigns_customersegment_overview",
            ),
            path(
                "snapshot/",
                self.admin_site.admin_view(self.snapshot_view),
                name="campaigns_customersegment_snapshot",
            ),
            *super().get_urls(),
        ]

    def snapshot_view(self, request: HttpRequest) -> HttpResponse:
        """POST: enqueue a snapshot of the chosen organization's last complete day (a manager's)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        chosen = request.POST.get("organization", "")
        org = (
            tenancy.scope(Organization.objects.all(), request.user, "pk", managed=True)
            .filter(pk=int(chosen))
            .first()
            if chosen.isdigit()
            else None
        )
        if org is None:
            raise PermissionDenied
        day = segments.default_day(org.timezone)
        if segments_snapshot_enqueue(organization_id=org.pk, day=day):
            messages.success(request, _("Segment snapshot of %(day)s enqueued.") % {"day": date_format(day)})
        else:
            messages.info(request, _("The snapshot of %(day)s is already taken.") % {"day": date_format(day)})
        url = reverse("admin:campaigns_customersegment_overview")
        return HttpResponseRedirect(f"{url}?organization={org.pk}")

    def overview_view(self, request: HttpRequest) -> TemplateResponse:
        """Customers per segment on a day and the movement from the snapshot before (three queries)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        # One query: the organizations the user sees, whether each has a snapshot (the ones shown)
        # and may take one (the ones the user manages: the "Take a snapshot now" form).
        visible = (
            tenancy.scope(Organization.objects.all(), request.user, "pk")
            .annotate(snapshots=Exists(SegmentMovement.objects.filter(organization_id=OuterRef("pk"))))
            .order_by("name")
            .values_list("pk", "name", "snapshots")
        )
        managed = tenancy.managed_ids(request.user)
        rows = list(visible)
        organizations = [(pk, name) for pk, name, snapshots in rows if snapshots]
        snapshot_organizations = [(pk, name) for pk, name, _s in rows if managed is None or pk in managed]
        chosen = request.GET.get("organization", "")
        org_id = int(chosen) if chosen.isdigit() else (organizations[0][0] if organizations else None)
        if org_id not in dict(organizations):
            org_id = None
        days = segments.segment_days(organization_id=org_id) if org_id else []
        wanted = request.GET.get("day", "")
        day = next((d for d in days if d.isoformat() == wanted), days[0] if days else None)
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": _("Customer segments"),
            "opts": self.model._meta,
            "organizations": organizations,
            "organization_id": org_id,
            "days": days,
            "day": day,
            "rules": segments.RULES,
            "snapshot_organizations": snapshot_organizations,
        }
        if org_id and day:
            movement = segments.segment_movement(organization_id=org_id, day=day)
            labels = [(str(s.value), s.label) for s in segments.Segment]
            columns = [*labels, ("", _("left the snapshot"))]
            context.update(
                previous_day=movement.previous_day,
                total=sum(movement.counts.values()),
                rows=[
                    {
                        "code": code,
                        "label": label,
                        "count": movement.counts[code],
                        "previous": movement.previous_counts[code],
                        "change": movement.counts[code] - movement.previous_counts[code],
                    }
                    for code, label in labels
                ],
                columns=columns,
                matrix=[
                    {
                        "code": code,
                        "label": label,
                        "cells": [
                            {
                                "to": to,
                                "n": movement.matrix.get((code, to), 0),
                                "stayed": bool(code) and code == to,
                            }
                            for to, _label in columns
                        ],
                    }
                    for code, label in [*labels, ("", _("not in the previous snapshot"))]
                ],
            )
        return TemplateResponse(request, "admin/campaigns/customersegment/overview.html", context)
