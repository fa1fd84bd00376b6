"""The operator's window on the runner: types (circuit state), handlers (pause, run, in flight),
executions (progress, cancel, replay DLQ), items (the DLQ and its replay), per-organization limits."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_POST

from crm import jobs, resilience, tenancy
from crm.tenancy import TenantAdmin
from integrations.admin import https_urls, write_only_input
from runner import dashboard, executions, operator
from runner.models import Execution, ExecutionItem, Handler, IntegrationType, RunnerSettings


def _snapshot(
    *, integration_keys: tuple[str, ...] = (), handler_ids: tuple[int, ...] = ()
) -> resilience.Snapshot:
    """Breakers and leases read in one round trip."""
    return resilience.snapshot(
        jobs.get_connection(),
        integration_keys=list(integration_keys),
        handler_ids=list(handler_ids),
        organization_ids=[],
    )


@admin.register(IntegrationType)
class IntegrationTypeAdmin(TenantAdmin):
    tenant_path = None  # integration types and their circuits serve every organization
    list_display = ("integration_key", "name", "enabled", "circuit")
    actions = ["reset_circuit"]

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The page's circuits read in one round trip (not one per row) for `circuit`."""
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)
        states = _snapshot(integration_keys=tuple(it.integration_key for it in rows)).breakers
        for it in rows:
            it.breaker = states[it.integration_key]
        return changelist

    @admin.display(description=_("circuit breaker"))
    def circuit(self, obj: IntegrationType) -> str:
        state = getattr(obj, "breaker", None)
        if state is None:  # shown outside the changelist
            state = _snapshot(integration_keys=(obj.integration_key,)).breakers[obj.integration_key]
        label = {"closed": _("closed"), "open": _("open"), "half": _("half-open")}[state.state]
        if state.state == "open":
            return f"{label} ({state.open_for} s)"
        if state.state == "closed" and state.failures:
            return f"{label} ({state.failures} ✗)"
        return str(label)

    @admin.action(description=_("Close the circuit breaker now"), permissions=["operate"])
    def reset_circuit(self, request: HttpRequest, queryset: QuerySet[IntegrationType]) -> None:
        for it in queryset:
            operator.integration_reset_circuit(integration=it)
        self.message_user(request, _("Circuit closed."), messages.SUCCESS)

    # The runner dashboard: one page over every handler, circuit and tenant (staff only: admin_view).
    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("dashboard/", view(self.dashboard_view), name="runner_dashboard"),
            path(
                "dashboard/handlers/<int:pk>/pause/",
                view(require_POST(self.handler_pause_view)),
                {"paused": True},
                name="runner_dashboard_pause",
            ),
            path(
                "dashboard/handlers/<int:pk>/resume/",
                view(require_POST(self.handler_pause_view)),
                {"paused": False},
                name="runner_dashboard_resume",
            ),
            path(
                "dashboard/integrations/<int:pk>/reset/",
                view(require_POST(self.integration_reset_view)),
                name="runner_dashboard_reset",
            ),
            *super().get_urls(),
        ]

    def _handler_admin(self) -> admin.ModelAdmin:
        return self.admin_site.get_model_admin(Handler)

    def dashboard_view(self, request: HttpRequest) -> TemplateResponse:
        """Handlers, circuits, tenants and the latest executions (a fixed number of queries)."""
        if not (self.has_view_permission(request) and self._handler_admin().has_view_permission(request)):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": _("Runner dashboard"),
            "opts": self.model._meta,
            "board": dashboard.runner_dashboard(),
            "item_statuses": ExecutionItem.Status.choices,
            "execution_statuses": Execution.Status.choices,
            "can_pause": self._handler_admin().has_change_permission(request),
            "can_reset": self.has_change_permission(request),
        }
        return TemplateResponse(request, "admin/runner/dashboard.html", context)

    def handler_pause_view(self, request: HttpRequest, pk: int, paused: bool) -> HttpResponseRedirect:
        """Pause or resume one handler through the service (so the config cache is invalidated)."""
        handlers = self._handler_admin()
        handler = get_object_or_404(handlers.get_queryset(request).select_related("integration"), pk=pk)
        if not handlers.has_change_permission(request, handler):
            raise PermissionDenied
        operator.handler_set_paused(handler=handler, paused=paused)
        text = _("Handler %(handler)s paused.") if paused else _("Handler %(handler)s resumed.")
        self.message_user(request, text % {"handler": handler}, messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:runner_dashboard") + f"#handler-{pk}")

    def integration_reset_view(self, request: HttpRequest, pk: int) -> HttpResponseRedirect:
        if not self.has_change_permission(request):
            raise PermissionDenied
        integration = get_object_or_404(IntegrationType, pk=pk)
        operator.integration_reset_circuit(integration=integration)
        self.message_user(
            request, _("Circuit of %(integration)s closed.") % {"integration": integration}, messages.SUCCESS
        )
        return HttpResponseRedirect(reverse("admin:runner_dashboard") + f"#integration-{pk}")


class HandlerForm(forms.ModelForm):
    auth_value = write_only_input(_("auth header value"))
    webhook_secret = write_only_input(_("webhook secret or token"))

    class Meta:
        formfield_callback = staticmethod(https_urls)  # URLs typed without a scheme: https
        model = Handler
        fields = [
            "integration",
            "handler_key",
            "direction",
            "kind",
            "callable_path",
            "endpoint_url",
            "auth_header",
            "auth_value",
            "organization",
            "concurrency",
            "rate_limit_per_minute",
            "batch_size",
            "paused",
            "schedule_cron",
            "webhook_auth",
            "webhook_secret",
        ]

    def save(self, commit: bool = True) -> Any:
        obj = super().save(commit=False)
        if self.cleaned_data.get("auth_value"):
            obj.set_auth_value(self.cleaned_data["auth_value"])
        if self.cleaned_data.get("webhook_secret"):
            obj.set_webhook_secret(self.cleaned_data["webhook_secret"])
        if commit:
            obj.save()
        return obj


@admin.register(Handler)
class HandlerAdmin(TenantAdmin):
    form = HandlerForm
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_display = (
        "__str__",
        "direction",
        "kind",
        "organization",
        "concurrency",
        "in_flight",
        "rate_limit_per_minute",
        "batch_size",
        "paused",
        "schedule_cron",
        "dlq",
    )
    list_filter = ("paused", "direction", "kind", "integration")
    list_select_related = ("integration", "organization")
    actions = ["pause", "resume", "run_now", "replay_dlq"]
    # What runs and for whom is the platform's: an organization's manager tunes the rest.
    operator_fields = ("integration", "handler_key", "direction", "kind", "callable_path", "organization")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return tenancy.is_operator(request.user)  # a handler is deployed code or an endpoint for a tenant

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if tenancy.is_operator(request.user) else fields + self.operator_fields

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The page's leases read in one round trip (not one per row) for `in_flight`."""
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)
        leases = _snapshot(handler_ids=tuple(h.pk for h in rows)).in_flight
        for h in rows:
            h.leases = leases[h.pk]
        return changelist

    @admin.display(description=_("in flight"))
    def in_flight(self, obj: Handler) -> int:
        leases = getattr(obj, "leases", None)
        return _snapshot(handler_ids=(obj.pk,)).in_flight[obj.pk] if leases is None else leases

    @admin.display(description=_("DLQ"))
    def dlq(self, obj: Handler) -> str:
        url = (
            reverse("admin:runner_executionitem_changelist")
            + f"?execution__handler__id__exact={obj.pk}&dlq=1"
        )
        return format_html('<a href="{}">{}</a>', url, _("DLQ items"))

    @admin.action(description=_("Pause the selected handlers"), permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Handler]) -> None:
        for h in queryset:
            operator.handler_set_paused(handler=h, paused=True)
        self.message_user(request, _("Paused: their items wait and resume in order."), messages.SUCCESS)

    @admin.action(description=_("Resume the selected handlers"), permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Handler]) -> None:
        for h in queryset:
            operator.handler_set_paused(handler=h, paused=False)
        self.message_user(request, _("Resumed."), messages.SUCCESS)

    @admin.action(description=_("Run now (manual trigger)"), permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Handler]) -> None:
        started = 0
        for h in queryset.select_related("integration"):
            if h.organization_id is None:
                self.message_user(
                    request,
                    _("%(handler)s serves every organization: use manage.py runner_run … --org SLUG.")
                    % {"handler": h},
                    messages.WARNING,
                )
                continue
            executions.execution_start(handler=h, organization_id=h.organization_id, trigger="manual")
            started += 1
        if started:
            self.message_user(request, _("Runs started: %(n)d.") % {"n": started}, messages.SUCCESS)

    @admin.action(description=_("Replay the DLQ items of the selected handlers"), permissions=["change"])
    def replay_dlq(self, request: HttpRequest, queryset: QuerySet[Handler]) -> None:
        n = sum(operator.items_replay(item_ids=operator.dlq_items(handler=h)) for h in queryset)
        self.message_user(request, _("Items replayed: %(n)d.") % {"n": n}, messages.SUCCESS)


@admin.register(Execution)
class ExecutionAdmin(TenantAdmin):
    list_display = (
        "id",
        "handler",
        "organization",
        "trigger",
        "status",
        "items_total",
        "items_succeeded",
        "items_failed",
        "items_cancelled",
        "items_remaining",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "trigger", "direction", "handler")
    list_select_related = ("handler__integration", "organization")
    show_full_result_count = False
    actions = ["cancel", "replay_dlq"]
    readonly_fields = [f.name for f in Execution._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description=_("Cancel (pending items are never processed)"), permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Execution]) -> None:
        n = sum(operator.execution_cancel(execution=e) for e in queryset)
        self.message_user(request, _("Items cancelled: %(n)d.") % {"n": n}, messages.SUCCESS)

    @admin.action(description=_("Replay the DLQ items of the selected executions"), permissions=["change"])
    def replay_dlq(self, request: HttpRequest, queryset: QuerySet[Execution]) -> None:
        n = sum(operator.items_replay(item_ids=operator.dlq_items(execution=e)) for e in queryset)
        self.message_user(request, _("Items replayed: %(n)d.") % {"n": n}, messages.SUCCESS)


class DlqFilter(admin.SimpleListFilter):
    title = _("DLQ")
    parameter_name = "dlq"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("1", _("in the DLQ"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ExecutionItem]) -> QuerySet[ExecutionItem]:
        if self.value() == "1":
            return queryset.filter(dlq_at__isnull=False)
        return queryset


@admin.register(ExecutionItem)
class ExecutionItemAdmin(TenantAdmin):
    list_display = (
        "id",
        "execution",
        "external_id",
        "status",
        "attempts",
        "last_error",
        "dlq_at",
        "finished_at",
    )
    list_filter = (DlqFilter, "status")
    search_fields = ("=external_id",)
    list_select_related = ("execution",)
    show_full_result_count = False
    raw_id_fields = ("execution",)
    readonly_fields = [f.name for f in ExecutionItem._meta.fields]
    actions = ["replay"]
    tenant_path = "execution__organization"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description=_("Replay the selected DLQ items"), permissions=["change"])
    def replay(self, request: HttpRequest, queryset: QuerySet[ExecutionItem]) -> None:
        n = operator.items_replay(item_ids=queryset.values_list("id", flat=True))
        self.message_user(
            request, ngettext("%(n)d item replayed.", "%(n)d items replayed.", n) % {"n": n}, messages.SUCCESS
        )


@admin.register(RunnerSettings)
class RunnerSettingsAdmin(TenantAdmin):
    tenant_path = None  # the per-organization limits are the platform's capacity, set by operators
    list_display = ("organization", "rate_limit_per_minute")
    list_select_related = ("organization",)
