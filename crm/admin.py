from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.timezone import localtime
from django.utils.translation import gettext_lazy as _
from django_rq.admin import QueueAdmin
from django_rq.models import Dashboard

from crm import checkpoints, customer_filters, customer_page, holdout, services, tenancy
from crm.admin_columns import elapsed, short_datetime
from crm.models import (
    ConsentChange,
    ConsentSource,
    Customer,
    HoldoutPeriod,
    InboxEvent,
    JobRun,
    Membership,
    Organization,
    Sale,
    Store,
)
from crm.money import format_money
from crm.tenancy import TenantAdmin, TenantInline

admin.site.site_header = _("CRM — operations")
admin.site.site_title = _("CRM")
# No public site behind the admin: Django's "View site" link would lead to a 404 at "/".
admin.site.site_url = None
# The model list beside every page took 300 px of a 1366-px screen from the lists (columns cut
# behind a sideways scroll); the index and the breadcrumbs lead everywhere it did.
admin.site.enable_nav_sidebar = False


class StoreInline(TenantInline):
    model = Store
    extra = 0
    fields = ("erp_code", "name")


class OperatorOnlyInline(admin.TabularInline):
    """An inline only platform operators see and edit."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return tenancy.is_operator(request.user)

    has_add_permission = has_change_permission = has_delete_permission = has_view_permission


class MembershipInline(OperatorOnlyInline):
    model = Membership
    extra = 0
    fields = ("user", "role", "created_at")
    readonly_fields = ("created_at",)
    raw_id_fields = ("user",)


class HoldoutPeriodInline(TenantInline):
    model = HoldoutPeriod
    extra = 0
    fields = ("percent", "started_at", "ended_at")
    readonly_fields = fields
    can_delete = False
    verbose_name_plural = _("global holdout history")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Organization)
class OrganizationAdmin(TenantAdmin):
    # What a manager reads at 1366 px; the caps, the survey channel and the rest on the detail page.
    list_display = ("name", "timezone", "sending", "last_30_days")
    search_fields = ("name", "slug")
    list_filter = ("timezone", "block_multiple_campaigns")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [StoreInline, MembershipInline, HoldoutPeriodInline]
    actions = ["holdout_reshuffle"]
    tenant_path = "pk"

    @admin.display(description=_("sending paused"))
    def sending(self, obj: Organization) -> str:
        """Paused channels with since when, or "—" when both send."""
        paused = [
            f"{label} {_('paused since')} {date_format(localtime(at), 'SHORT_DATETIME_FORMAT')}"
            for label, at in (("WhatsApp", obj.whatsapp_paused_at), (_("email"), obj.email_paused_at))
            if at
        ]
        return "; ".join(paused) or "—"

    @admin.display(description=_("last 30 days"))
    def last_30_days(self, obj: Organization) -> str:
        return format_html(
            '<a href="{}">{}</a>', reverse("admin:crm_organization_dashboard", args=[obj.pk]), _("dashboard")
        )

    fieldsets = (
        (None, {"fields": ("name", "slug", "timezone")}),
        (
            _("Campaign settings"),
            {
                "fields": (
                    "message_limit_count",
                    "message_limit_days",
                    "block_multiple_campaigns",
                    "contact_caps_scope",
                    "attribution_window_days",
                    ("cost_conversion_rate", "cost_conversion_currency"),
                )
            },
        ),
        (
            _("Incrementality"),
            {
                "fields": (
                    "holdout_percent",
                    ("attribution_window_whatsapp_days", "attribution_window_email_days"),
                    "attribution_engaged_only",
                ),
                "description": _(
                    "The global holdout never receives marketing; its history is listed below. The "
                    "windows per channel and the engagement rule apply to attributed sales and, for the "
                    "windows, to each campaign's lift report."
                ),
            },
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
        (
            _("Queues"),
            {
                "fields": ("queue_weight",),
                "description": _(
                    "Organizations with work waiting on a queue are served in turn; this weight is the "
                    "organization's share of the turns. Set by platform operators."
                ),
            },
        ),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        readonly = tuple(super().get_readonly_fields(request, obj))
        # A tenant's manager does not raise their own share of the platform's workers.
        return readonly if tenancy.is_operator(request.user) else (*readonly, "queue_weight")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return tenancy.is_operator(request.user)  # organizations are the platform's to create

    def save_model(self, request: HttpRequest, obj: Organization, form: Any, change: bool) -> None:
        """A change of the holdout's share goes through crm.holdout, which keeps its history."""
        percent = obj.holdout_percent
        if change and "holdout_percent" in form.changed_data:
            obj.holdout_percent = Organization.objects.get(pk=obj.pk).holdout_percent
        super().save_model(request, obj, form, change)
        if "holdout_percent" in form.changed_data:
            holdout.holdout_set(organization=obj, percent=percent)

    @admin.action(
        description=_("Reshuffle the global holdout (a new draw; the old one stays in history)"),
        permissions=["change"],
    )
    def holdout_reshuffle(self, request: HttpRequest, queryset: QuerySet[Organization]) -> None:
        for organization in queryset:
            holdout.holdout_set(
                organization=organization, percent=organization.holdout_percent, reshuffle=True
            )
        self.message_user(request, _("Holdout reshuffled."))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return tenancy.is_operator(request.user)

    def get_urls(self) -> list:
        pages = [
            path(
                f"<int:pk>/{route}",
                self.admin_site.admin_view(functools.partial(self.organization_page_view, view)),
                name=name,
            )
            for route, name, view in _organization_pages.values()
        ]
        return [*pages, *super().get_urls()]

    def organization_page_view(self, view: OrganizationPage, request: HttpRequest, pk: int) -> HttpResponse:
        """A registered page of one organization the user may see (404 for another one's)."""
        organization = self.get_queryset(request).filter(pk=pk).first()
        if organization is None:
            raise Http404
        if not self.has_view_permission(request, organization):
            raise PermissionDenied
        return view(self, request, organization)


# A page of one organization that an app adds to the organization's admin (the campaigns app's
# dashboard): called with the admin, the request and an organization the user may view.
OrganizationPage = Callable[[OrganizationAdmin, HttpRequest, Organization], HttpResponse]
_organization_pages: dict[str, tuple[str, str, OrganizationPage]] = {}


def register_organization_page(route: str, *, name: str) -> Callable[[OrganizationPage], OrganizationPage]:
    """Mount the decorated view at /admin/crm/organization/<pk>/<route> as `admin:<name>`; the
    platform checks the organization's scope and the view permission before calling it. Apps
    register from their AppConfig.ready (before the URLconf is first read)."""

    def decorator(view: OrganizationPage) -> OrganizationPage:
        _organization_pages[name] = (route, name, view)
        return view

    return decorator


@admin.register(Store)
class StoreAdmin(TenantAdmin):
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


class CustomerFilterListFilter(admin.ListFilter):
    """The customer filter (crm.customer_filters) on the customer list: every term in one form,
    combined; the list's count is the filter's live count."""

    title = _("customer filter")
    template = "admin/crm/customer_filter.html"
    prefix = "cf_"
    terms = customer_filters.TERMS

    def __init__(self, request: HttpRequest, params: dict, model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        for name in self.expected_parameters():
            if name is not None and name in params:
                value = params.pop(name)
                self.used_parameters[name] = value[-1] if isinstance(value, list) else value
        self.organization_id = _single_organization(request)
        form_class = type(
            "CustomerFilterForm",
            (forms.Form,),
            dict(
                customer_filters.form_fields(
                    terms=self.visible_terms(),
                    prefix=self.prefix,
                    stores=None
                    if self.organization_id is None
                    else Store.objects.filter(organization_id=self.organization_id)
                    .order_by("name")
                    .values_list("pk", "name"),
                )
            ),
        )
        self.form = form_class(data=self.used_parameters or None)

    def visible_terms(self) -> tuple[str, ...]:
        """The segment term needs one organization (its snapshots)."""
        return tuple(t for t in self.terms if t != "segment" or self.organization_id is not None)

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return [self.prefix + term for term in self.terms]

    def choices(self, changelist: Any) -> Any:
        yield {
            "form": self.form,
            "kept": [
                (k, v) for k, v in changelist.params.items() if k not in self.used_parameters and k != "p"
            ],
        }

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if not self.used_parameters:
            return queryset
        if not self.form.is_valid():
            raise IncorrectLookupParameters(self.form.errors.as_text())
        terms = customer_filters.from_cleaned(self.form.cleaned_data, prefix=self.prefix)
        return terms.apply(queryset, organization_id=self.organization_id)


def _single_organization(request: HttpRequest) -> int | None:
    """The one organization the list shows: the user's only one, or the one picked in its filter."""
    picked = request.GET.get("organization__id__exact", "")
    ids = tenancy.organization_ids(request.user)
    if picked.isdigit() and (ids is None or int(picked) in ids):
        return int(picked)
    return next(iter(ids)) if ids is not None and len(ids) == 1 else None


class ConsentChangeInline(TenantInline):
    """The customer's consent history, read-only (written by crm.services.customers_consent_set)."""

    model = ConsentChange
    extra = 0
    can_delete = False
    fields = readonly_fields = ("at", "given", "source", "by")
    ordering = ("-at",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Customer)
class CustomerAdmin(TenantAdmin):
    list_display = (
        "name",
        "email",
        "phone",
        "erp_id",
        "organization",
        "marketing_consent",
        "opted_out",
    )
    list_select_related = ("organization",)
    search_fields = ("name", "=email", "=phone", "=erp_id", "=cpf_cnpj")
    list_filter = (
        CustomerFilterListFilter,
        "organization",
        "marketing_consent",
        "marketing_consent_source",
        OptOutFilter,
    )
    show_full_result_count = False  # no second COUNT(*) over a million rows
    # Consent is changed only by the actions below (who and when are kept), never typed in the form.
    readonly_fields = (
        "created_at",
        "updated_at",
        "erp_trans_id",
        "erp_registered_at",
        "marketing_consent",
        "consent_at",
        "marketing_consent_source",
        "marketing_consent_by",
        "profile",
    )
    actions = ("consent_record", "consent_withdraw")
    inlines = (ConsentChangeInline,)
    fieldsets = (
        (None, {"fields": ("organization", "erp_id", "name", "cpf_cnpj", "email", "phone")}),
        (
            _("Consent and opt-out"),
            {
                "fields": (
                    ("marketing_consent", "marketing_consent_source"),
                    ("consent_at", "marketing_consent_by"),
                    ("whatsapp_opted_out_at", "whatsapp_opt_out_source"),
                    ("email_opted_out_at", "email_opt_out_source"),
                )
            },
        ),
        (_("The person"), {"fields": ("profile",)}),
        (_("Record"), {"fields": ("created_at", "updated_at", "erp_trans_id", "erp_registered_at")}),
    )

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> Any:
        """A phone or a CPF however typed is found by its normalized form (customer_page)."""
        if customer_page.looks_like_number(search_term):
            organizations = list(
                tenancy.scope(Organization.objects.all(), request.user, "pk").values_list("pk", flat=True)
            )
            return customer_page.number_search(queryset, search_term, organization_ids=organizations), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description=_("purchases, messages, consent, segment, surveys"))
    def profile(self, obj: Customer) -> str:
        if not obj.pk:
            return "—"
        return format_html_join(
            "",
            '<section class="customer-section"><h3>{}</h3>{}</section>',
            customer_page.customer_sections(obj),
        )

    @admin.action(
        description=_("Record marketing consent (given by the customer to me)"), permissions=["change"]
    )
    def consent_record(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._consent(request, queryset, given=True, done=_("Consent recorded for %(n)d customer(s)."))

    @admin.action(description=_("Withdraw marketing consent"), permissions=["change"])
    def consent_withdraw(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._consent(request, queryset, given=False, done=_("Consent withdrawn for %(n)d customer(s)."))

    def _consent(self, request: HttpRequest, queryset: QuerySet, *, given: bool, done: Any) -> None:
        """Consent as the manager records it: source "admin", who and when kept, with its history."""
        changed = services.customers_consent_set(
            customer_ids=queryset.values_list("pk", flat=True),
            given=given,
            source=ConsentSource.ADMIN,
            by_id=request.user.pk,
        )
        self.message_user(request, str(done) % {"n": changed})

    @admin.display(description=_("opted out"), ordering="whatsapp_opted_out_at")
    def opted_out(self, obj: Customer) -> str:
        """Both opt-outs in one column (two dates side by side did not fit a 1366-px screen)."""
        parts = [
            f"{label} {date_format(localtime(at), 'SHORT_DATE_FORMAT')}"
            for label, at in (("WhatsApp", obj.whatsapp_opted_out_at), (_("email"), obj.email_opted_out_at))
            if at is not None
        ]
        return " · ".join(parts) or "—"


@admin.register(Sale)
class SaleAdmin(TenantAdmin):
    list_display = (
        "erp_id",
        short_datetime("sold_at", _("sold at")),
        "total_display",
        "store",
        "customer",
        "organization",
    )
    list_select_related = ("store", "customer", "organization")
    search_fields = ("=erp_id", "customer__name", "=customer__email")
    list_filter = ("organization", "store")
    date_hierarchy = "sold_at"
    raw_id_fields = ("customer", "store")
    show_full_result_count = False
    readonly_fields = ("items", "erp_trans_id")  # as the ERP sent them

    @admin.display(description=_("total"), ordering="total")
    def total_display(self, obj: Sale) -> str:
        return format_money(obj.total)


@admin.register(JobRun)
class JobRunAdmin(TenantAdmin):
    list_display = (
        "kind",
        "key",
        "status",
        "attempts",
        short_datetime("started_at", _("started at")),
        short_datetime("finished_at", _("finished at")),
        elapsed("started_at", "finished_at", _("duration")),
        "organization",
    )
    list_select_related = ("organization",)
    list_filter = ("status", "kind")
    search_fields = ("kind", "key", "job_id")
    readonly_fields = [f.name for f in JobRun._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """The traceback (server paths, source lines) for platform operators; the organization's
        people see its last line, the reason."""
        fields = list(super().get_fields(request, obj))
        if tenancy.is_operator(request.user):
            return fields
        return [("error_reason" if f == "error" else f) for f in fields if f != "error_reason"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*super().get_readonly_fields(request, obj), "error_reason"]

    @admin.display(description=_("error"))
    def error_reason(self, obj: JobRun) -> str:
        return checkpoints.error_reason(obj.error)


@admin.register(Membership)
class MembershipAdmin(TenantAdmin):
    """Who belongs to which organization with which role (platform operators only; also inline on
    the organization). Adding one makes the user staff; removing their last one undoes it."""

    tenant_path = None
    list_display = ("user", "organization", "role", "created_at")
    list_select_related = ("user", "organization")
    list_filter = ("role", "organization")
    search_fields = ("user__username", "user__email", "organization__name", "=organization__slug")
    raw_id_fields = ("user",)


@admin.register(Dashboard)
class RqDashboardAdmin(QueueAdmin):
    """django-rq's dashboard in the admin index (its own admin, RQ_SHOW_ADMIN_LINK, is off): every
    queue of every organization, so for platform operators only, like /admin/rq/."""

    platform_admin = True

    def has_module_permission(self, request: HttpRequest) -> bool:
        return tenancy.is_operator(request.user)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return tenancy.is_operator(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return tenancy.is_operator(request.user)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        return tenancy.operator_required(super().changelist_view)(request, extra_context)

    def get_urls(self) -> list:
        return tenancy.operator_urls(super().get_urls())


@admin.register(InboxEvent)
class InboxEventAdmin(TenantAdmin):
    """Accepted webhook events not applied yet (those kept for a retry show when: `not_before`),
    and those set aside (their handler refused them alone, or could still not apply them after the
    last retry: `error` says why). Read-only; deleting a set-aside event forgets it. Every
    organization's events: platform operators only."""

    tenant_path = None

    list_display = ("id", "kind", "organization_id", "received_at", "not_before", "failed_at")
    list_filter = ("kind",)
    readonly_fields = [f.name for f in InboxEvent._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: InboxEvent | None = None) -> bool:
        return False
