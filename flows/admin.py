"""The flows' admin: each flow with its steps and counts, pause/resume, a test-send to one customer
and a dry-run of who a date or no-purchase trigger enters today."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from campaigns import lift_pages
from crm.models import Customer
from crm.tenancy import TenantAdmin
from flows import schema, selectors, services, triggers
from flows.models import Enrollment, EnrollmentStep, Flow, step_label


class FlowForm(forms.ModelForm):
    """The same strict validation as `flows import`: a definition with an unknown key or a bad
    value is a form error naming its path, never saved."""

    class Meta:
        model = Flow
        fields = (
            "organization",
            "key",
            "name",
            "trigger",
            "reentry",
            "exit_on",
            "steps",
            "transactional",
            "paused",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            clean = schema.flow_parse(
                {
                    k: data.get(k)
                    for k in ("key", "name", "trigger", "reentry", "exit_on", "steps", "transactional")
                }
            )
        except schema.FlowSchemaError as exc:
            raise forms.ValidationError(str(exc)) from None
        data.update({k: clean[k] for k in ("trigger", "reentry", "exit_on", "steps")})
        return data


@admin.register(Flow)
class FlowAdmin(TenantAdmin):
    list_display = ("key", "name", "trigger_type", "paused", "transactional", "version")
    list_filter = ("trigger_type", "paused")
    search_fields = ("key", "name")
    readonly_fields = ("version", "trigger_type", "figures")
    fields = (*FlowForm.Meta.fields, "version", "figures")
    actions = ("pause", "resume")

    form = FlowForm

    def save_model(self, request: HttpRequest, obj: Flow, form: Any, change: bool) -> None:
        if change and "steps" in form.changed_data:
            obj.version += 1
        super().save_model(request, obj, form, change)

    @admin.display(description=gettext_lazy("steps and counts"))
    def figures(self, obj: Flow) -> str:
        if obj.pk is None:
            return "-"
        # The flow as stored: a form that did not validate (steps "0") has changed obj in memory.
        obj = Flow.objects.get(pk=obj.pk)
        status = selectors.flow_status(flow=obj)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            (
                (
                    s["index"],
                    step_label(s["type"]),
                    s["done"],
                    s["sent"],
                    s["revenue"],
                    json.dumps(obj.steps[s["index"]], ensure_ascii=False),
                )
                for s in status["steps"]
            ),
        )
        links = format_html(
            '<a href="{}">{}</a> · <a href="{}">{}</a>',
            reverse("admin:flows_flow_test_send", args=[obj.pk]),
            _("test-send to one customer"),
            reverse("admin:flows_flow_dry_run", args=[obj.pk]),
            _("dry-run: who enters today"),
        )
        return format_html(
            "<p>{}</p><table><tr><th>#</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>JSON</th></tr>"
            "{}</table><p>{}</p><h3>{}</h3>{}",
            _(
                "entered %(entered)s, active %(active)s, completed %(completed)s, exited %(exited)s, "
                "sent %(sent)s, failed %(failed)s, revenue %(revenue)s"
            )
            % status,
            _("type"),
            _("done"),
            _("sent"),
            _("revenue"),
            rows,
            links,
            _("Incrementality"),
            self._lift(obj, status),
        )

    @staticmethod
    def _lift(obj: Flow, status: dict[str, Any]) -> str:
        """Attributed (last touch) and incremental side by side, from the holdout branch's customers."""
        report = selectors.flow_lift(flow=obj)
        if report is None:
            return format_html(
                "<p>{}</p>",
                _(
                    "No holdout branch: what this flow caused cannot be told apart from what would have "
                    "sold anyway. A split step with a holdout branch gives it a control group."
                ),
            )
        return lift_pages.report_side_by_side(
            report,
            revenue=Decimal(status["revenue"]),
            buyers=selectors.flow_attributed_buyers(flow=obj),
            flow=True,
        )

    @admin.action(description=gettext_lazy("Pause the selected flows"), permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet) -> None:
        for flow in queryset:
            services.flow_set_paused(flow=flow, paused=True)

    @admin.action(description=gettext_lazy("Resume the selected flows"), permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet) -> None:
        for flow in queryset:
            services.flow_set_paused(flow=flow, paused=False)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:pk>/test-send/",
                self.admin_site.admin_view(self.test_send_view),
                name="flows_flow_test_send",
            ),
            path(
                "<int:pk>/dry-run/", self.admin_site.admin_view(self.dry_run_view), name="flows_flow_dry_run"
            ),
            *super().get_urls(),
        ]

    def _flow(self, request: HttpRequest, pk: int) -> Flow:
        flow = self.scoped(request, Flow.objects.select_related("organization")).filter(pk=pk).first()
        if flow is None or not self.has_view_permission(request, flow):
            raise Http404
        return flow

    def test_send_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """GET: a customer to send to; POST: that customer enters the flow now (trigger and reentry aside)."""
        flow = self._flow(request, pk)
        if request.method == "POST":
            if not self.has_change_permission(request, flow):
                raise Http404
            customer = Customer.objects.filter(
                organization_id=flow.organization_id, pk=request.POST.get("customer") or 0
            ).first()
            if customer is None:
                messages.error(request, _("No such customer in this organization."))
            else:
                services.flow_test_send(flow=flow, customer=customer)
                messages.success(request, _("%(customer)s entered the flow now.") % {"customer": customer})
            return HttpResponseRedirect(reverse("admin:flows_flow_change", args=[flow.pk]))
        context = {
            **self.admin_site.each_context(request),
            "flow": flow,
            "opts": self.model._meta,
            "title": _("Test-send"),
        }
        return TemplateResponse(request, "admin/flows/test_send.html", context)

    def dry_run_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        flow = self._flow(request, pk)
        total, first = triggers.dry_run(flow=flow)
        customers = Customer.objects.filter(pk__in=first).order_by("pk")
        context = {
            **self.admin_site.each_context(request),
            "flow": flow,
            "opts": self.model._meta,
            "title": _("Dry-run"),
            "total": total,
            "customers": customers,
            "time_based": flow.trigger_type in triggers.TIME_TRIGGERS,
        }
        return TemplateResponse(request, "admin/flows/dry_run.html", context)


@admin.register(Enrollment)
class EnrollmentAdmin(TenantAdmin):
    list_display = ("flow", "customer", "round", "status", "step_index", "due_at", "branch", "entered_at")
    list_filter = ("status",)
    raw_id_fields = ("customer", "flow")
    list_select_related = ("flow", "customer")
    readonly_fields = [f.name for f in Enrollment._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(EnrollmentStep)
class EnrollmentStepAdmin(TenantAdmin):
    tenant_path = "enrollment__organization"
    list_display = ("enrollment", "index", "type", "outcome", "detail", "campaign", "at")
    list_filter = ("outcome", "type")
    readonly_fields = [f.name for f in EnrollmentStep._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
