"""Who sees and does what in the admin: the one place organizations' boundaries are drawn.

- A **platform operator** is a superuser or an active user with the permission
  `crm.operate_platform`. Operators see every organization and may do everything (the queue
  pages, the RQ dashboard, the cron table, /admin/metrics, the runner's circuits and limits).
- A **member** has a `Membership` in one or more organizations: `manager` (view, add, change,
  delete the organization's objects and run their actions) or `viewer` (view only). A member
  sees only their organizations' rows; another organization's object answers 404. Django's
  per-user model permissions are not consulted for members: the role decides.
- Anyone else who is staff sees an empty admin.

Every ModelAdmin of the apps derives from `TenantAdmin` (below) and declares once how its model
reaches the organization (`tenant_path`): "organization" (the
default), "campaign__organization", "pk" for Organization itself, or None for a platform model
(operators only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin import widgets
from django.core.exceptions import FieldDoesNotExist, PermissionDenied, ValidationError
from django.db import models
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver
from django.utils.translation import gettext_lazy as _

from crm import admin_links, intake
from crm.admin_lists import CheckedLists
from crm.models import Membership
from crm.number_input import LocalizedDecimalField, LocalizedFloatField
from crm.ptbr import gender_agree

OPERATE_PLATFORM = "crm.operate_platform"
MANAGER = "manager"
VIEWER = "viewer"


def is_operator(user: Any) -> bool:
    """A superuser or a user granted `crm.operate_platform` (superusers have every permission)."""
    return bool(user and user.is_active and user.has_perm(OPERATE_PLATFORM))


def roles(user: Any) -> dict[int, str]:
    """{organization id: role} of the user's memberships; read once per request (kept on the user)."""
    if not user or not user.is_authenticated or not user.is_active:
        return {}
    cached = getattr(user, "_crm_roles", None)
    if cached is None:
        cached = dict(Membership.objects.filter(user_id=user.pk).values_list("organization_id", "role"))
        user._crm_roles = cached
    return cached


def organization_ids(user: Any) -> set[int] | None:
    """The organizations the user may see: None means every one (an operator)."""
    if is_operator(user):
        return None
    return set(roles(user))


def managed_ids(user: Any) -> set[int] | None:
    """The organizations the user may change: None means every one (an operator)."""
    if is_operator(user):
        return None
    return {org for org, role in roles(user).items() if role == MANAGER}


def may_view(user: Any, organization_id: int | None = None) -> bool:
    """May view `organization_id`'s objects (any organization's, when None)."""
    ids = organization_ids(user)
    if ids is None:
        return True
    return bool(ids) if organization_id is None else organization_id in ids


def may_manage(user: Any, organization_id: int | None = None) -> bool:
    """May change `organization_id`'s objects (any organization's, when None)."""
    ids = managed_ids(user)
    if ids is None:
        return True
    return bool(ids) if organization_id is None else organization_id in ids


def scope(queryset: QuerySet, user: Any, path: str | None, *, managed: bool = False) -> QuerySet:
    """`queryset` limited to the user's organizations through `path` (None: operators only): those
    the user sees, or with `managed` those the user may change (a form's choices)."""
    ids = managed_ids(user) if managed else organization_ids(user)
    if ids is None:
        return queryset
    if path is None or not ids:
        return queryset.none()
    return queryset.filter(**{f"{path}__in": ids})


def organization_of(obj: Model, path: str | None) -> int | None:
    """The organization id of `obj` through `path` ("organization", "campaign__organization", "pk")."""
    if path is None:
        return None
    if path == "pk":
        return obj.pk
    *hops, last = path.split("__")
    target: Any = obj
    for hop in hops:
        target = getattr(target, hop, None)
        if target is None:
            return None
    return getattr(target, f"{last}_id", None)


def operator_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A platform page: 403 for anyone logged in who is not an operator (mount it through
    `admin.site.admin_view`, which sends the anonymous and non-staff to the login first)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_operator(request.user):
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return wrapper


def operator_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """`view` as a platform page in the admin: login, staff, operator, CSRF, never cached."""
    return admin.site.admin_view(operator_required(view))


def operator_urls(patterns: Sequence[URLPattern | URLResolver]) -> list[URLPattern | URLResolver]:
    """Another app's URL patterns (django-rq's dashboard) with every view for operators only."""
    guarded: list[URLPattern | URLResolver] = []
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            guarded.append(
                URLResolver(
                    pattern.pattern,
                    operator_urls(list(pattern.url_patterns)),
                    pattern.default_kwargs,
                    pattern.app_name,
                    pattern.namespace,
                )
            )
        else:
            guarded.append(
                URLPattern(
                    pattern.pattern, operator_view(pattern.callback), pattern.default_args, pattern.name
                )
            )
    return guarded


class TenantRelatedFilter(admin.RelatedFieldListFilter):
    """A list filter on a relation whose choices are only the user's organizations' rows."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        related = field.remote_field.model
        queryset = scoped_related(model_admin.admin_site, related, request)
        ordering = self.field_admin_ordering(field, request, model_admin)
        if ordering:
            queryset = queryset.order_by(*ordering)
        return [(obj.pk, str(obj)) for obj in queryset[:500]]


def tenant_path_of(site: admin.AdminSite, model: type[Model]) -> str | bool | None:
    """How `model` reaches the organization, as its registered admin declares it; False when the
    model is not organization-bound (no TenantAdmin registered for it)."""
    model_admin = site._registry.get(model)
    if isinstance(model_admin, TenantAdmin):
        return model_admin.tenant_path
    return False


def scoped_related(
    site: admin.AdminSite, model: type[Model], request: HttpRequest, *, managed: bool = False
) -> QuerySet:
    """`model`'s rows the user may pick: a filter's (the organizations the user sees) or, with
    `managed`, a form's (those the user may change: a manager of A who views B writes into A only)."""
    queryset = model._default_manager.all()
    path = tenant_path_of(site, model)
    if path is False or path is None:
        return queryset  # not organization-bound, or the platform's reference data (integration types)
    return scope(queryset, request.user, path, managed=managed)  # type: ignore[arg-type]


class TenantRawIdWidget(widgets.ForeignKeyRawIdWidget):
    """A raw-id input whose label (the name beside the id) is shown only for a row of `queryset`: an
    id typed or prefilled in the URL (?customer=<id>) names nothing of another organization."""

    def __init__(self, rel: Any, admin_site: admin.AdminSite, *, queryset: QuerySet, **kwargs: Any) -> None:
        super().__init__(rel, admin_site, **kwargs)
        self.queryset = queryset

    def label_and_url_for_value(self, value: Any) -> tuple[str, str]:
        key = self.rel.get_related_field().name
        try:
            visible = self.queryset.filter(**{key: value}).exists()
        except (ValueError, TypeError, ValidationError):
            return "", ""
        return super().label_and_url_for_value(value) if visible else ("", "")


def storable_json(value: Any) -> None:
    """A form validator: the JSON value holds nothing jsonb refuses (crm.intake's strict rules)."""
    try:
        intake.check_json(value)
    except intake.BadBody as exc:
        raise ValidationError(str(exc), code="invalid") from None


class StorableJSONField(forms.JSONField):
    """A JSON form field that refuses what jsonb cannot store; with `empty_default`, an empty
    value (or null) is that default, for a column that takes no NULL."""

    def __init__(self, *, empty_default: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.empty_default = empty_default
        self.validators.append(storable_json)

    def to_python(self, value: Any) -> Any:
        converted = super().to_python(value)
        if converted is None and self.empty_default is not None:
            return self.empty_default()
        return converted


UNIQUE_CODES = frozenset({"unique", "unique_together"})
TAKEN = _("This value cannot be used. Choose another one.")


class TenantFormMixin:
    """Mixed into the form of every TenantAdmin for its members: a uniqueness error over a value
    that other organizations share the space of (a Meta phone number id, a slug) says only that the
    value cannot be used, never which model or field holds it elsewhere; an error of a check that
    includes `tenant_field` (the organization's) speaks of the user's own rows and is kept."""

    tenant_field: str | None = None
    _errors: Any
    fields: dict[str, Any]
    add_error: Callable[..., None]

    def _post_clean(self) -> None:
        super()._post_clean()  # type: ignore[misc]
        if not self._errors:
            return
        for name, errors in list(self._errors.items()):
            data = errors.as_data()
            if not any(self._reveals(e) for e in data):
                continue
            kept = [e for e in data if not self._reveals(e)]
            del self._errors[name]
            field = name if name in self.fields else None
            self.add_error(field, [*kept, ValidationError(TAKEN, "unique")])

    def _reveals(self, error: ValidationError) -> bool:
        """A uniqueness check that spans organizations (its fields leave the organization out)."""
        if error.code not in UNIQUE_CODES:
            return False
        checked = (error.params or {}).get("unique_check") or ()
        return self.tenant_field is None or self.tenant_field not in checked


class TenantAdmin(CheckedLists):
    """The base of every ModelAdmin: rows, objects, choices, filters, autocomplete, search and
    actions limited to the user's organizations; permissions from the membership role."""

    # How the model reaches its organization (a lookup path), "pk" for Organization, None for a
    # platform model that only operators see.
    tenant_path: str | None = "organization"

    # --- rows -------------------------------------------------------------------------------------
    def message_user(self, request: HttpRequest, message: Any, *args: Any, **kwargs: Any) -> None:
        """Django's generic messages agree with a feminine model name in pt-BR (crm.ptbr)."""
        super().message_user(request, gender_agree(message, self.model._meta.verbose_name), *args, **kwargs)

    def get_action_choices(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        """Django's "Remover %(verbose_name_plural)s selecionados" agrees too: "campanhas selecionadas"."""
        plural = self.model._meta.verbose_name_plural
        return [
            (name, gender_agree(label, plural))
            for name, label in super().get_action_choices(request, *args, **kwargs)
        ]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return scope(super().get_queryset(request), request.user, self.tenant_path)

    def response_action(self, request: HttpRequest, queryset: QuerySet) -> Any:
        """Every action changes (or deletes, starts, resumes…) the rows it is given: only those of
        the organizations the user manages, whatever was selected on the list, which also shows
        those the user only views."""
        return super().response_action(request, scope(queryset, request.user, self.tenant_path, managed=True))

    def scoped(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        """Any queryset of this admin's model limited to the user's organizations (custom views)."""
        return scope(queryset, request.user, self.tenant_path)

    def _get_obj_does_not_exist_redirect(self, request: HttpRequest, opts: Any, object_id: str) -> Any:
        """Another organization's object (or none) answers 404, not a redirect that says it exists."""
        raise Http404

    # --- choices, prefilled values, errors ---------------------------------------------------------
    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        """Every JSON field of every form refuses what PostgreSQL's jsonb cannot store, and an
        emptied one of a NOT NULL column is its default (a form error or a value, not a 500). Every
        decimal or float field reads and shows the locale's numbers ("150,00", "1.234,56" in
        pt-BR; "150.00" too), as a manager types them."""
        if isinstance(db_field, models.DecimalField | models.FloatField):
            kwargs.setdefault("localize", True)  # and a malformed "1.2.3,4" is refused, not 123,4
            kwargs.setdefault(
                "form_class",
                LocalizedDecimalField if isinstance(db_field, models.DecimalField) else LocalizedFloatField,
            )
        if isinstance(db_field, models.JSONField):
            kwargs.setdefault("form_class", StorableJSONField)
            if not db_field.null and db_field.has_default():
                kwargs.setdefault("empty_default", db_field.get_default)
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        related = db_field.remote_field.model
        if "queryset" not in kwargs:
            kwargs["queryset"] = scoped_related(self.admin_site, related, request, managed=True)
        if "widget" not in kwargs and db_field.name in self.raw_id_fields:
            kwargs["widget"] = TenantRawIdWidget(
                db_field.remote_field,
                self.admin_site,
                queryset=scoped_related(self.admin_site, related, request),
                using=kwargs.get("using"),
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if "queryset" not in kwargs:
            kwargs["queryset"] = scoped_related(
                self.admin_site, db_field.remote_field.model, request, managed=True
            )
        return super().formfield_for_manytomany(db_field, request, **kwargs)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        """The form prefilled from the URL (?customer=<id>, ?store=…): a relation's value only when it
        is one of the user's choices, so walking ids names nothing of another organization. A
        manager of one organization finds it chosen (a campaign's templates are that organization's)."""
        initial = super().get_changeform_initial_data(request)
        managed = managed_ids(request.user)
        has_organization = any(f.name == "organization" and f.many_to_one for f in self.model._meta.fields)
        if has_organization and managed is not None and len(managed) == 1 and "organization" not in initial:
            initial["organization"] = str(next(iter(managed)))
        for name, value in list(initial.items()):
            try:
                field = self.model._meta.get_field(name)
            except FieldDoesNotExist:
                continue
            if field.is_relation and (field.many_to_one or field.one_to_one or field.many_to_many):
                initial[name] = self._choices_among(request, field, value)
        return initial

    def _choices_among(self, request: HttpRequest, field: Any, value: Any) -> Any:
        values = value if isinstance(value, list) else [value]
        key = field.target_field.attname if not field.many_to_many else "pk"
        queryset = scoped_related(self.admin_site, field.related_model, request, managed=True)
        try:
            allowed = {str(v) for v in queryset.filter(**{f"{key}__in": values}).values_list(key, flat=True)}
        except (ValueError, TypeError, ValidationError):
            allowed = set()
        kept = [v for v in values if str(v) in allowed]
        if isinstance(value, list):
            return kept
        return kept[0] if kept else None

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """The admin's form; for an organization's member, uniqueness errors that would say what
        another organization holds become one generic message (TenantFormMixin)."""
        form = super().get_form(request, obj, change, **kwargs)
        if is_operator(request.user):
            return form
        path = self.tenant_path
        tenant_field = None if path in (None, "pk") else path.split("__")[0]  # type: ignore[union-attr]
        return type(form.__name__, (TenantFormMixin, form), {"tenant_field": tenant_field})

    def render_change_form(
        self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        """A read-only relation links to its object only for a reader who may open it (crm.admin_links)."""
        admin_links.remember_reader(request, context)
        return super().render_change_form(request, context, *args, **kwargs)

    def get_list_display(self, request: HttpRequest) -> Any:
        """A member of one organization is not shown its name on every row of a list: the room goes
        to the columns that differ (lists fit a 1366-px screen)."""
        shown = super().get_list_display(request)
        ids = organization_ids(request.user)
        if ids is None or len(ids) != 1 or self.tenant_path != "organization":
            return shown
        return [column for column in shown if column != "organization"] or shown

    def get_list_filter(self, request: HttpRequest) -> Any:
        """Relation filters list only the user's organizations' rows."""
        filters = []
        for entry in super().get_list_filter(request):
            if isinstance(entry, str) and self._relation_to_tenant(entry):
                entry = (entry, TenantRelatedFilter)
            filters.append(entry)
        return filters

    def _relation_to_tenant(self, name: str) -> bool:
        model: Any = self.model
        field = None
        for part in name.split("__"):
            field = model._meta.get_field(part)
            if not field.is_relation:
                return False
            model = field.related_model
        return field is not None and tenant_path_of(self.admin_site, model) is not False

    # --- permissions --------------------------------------------------------------------------------
    def _organization(self, obj: Any) -> int | None:
        return organization_of(obj, self.tenant_path)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if is_operator(request.user):
            return True
        if self.tenant_path is None:
            return False
        if obj is None:
            return may_view(request.user)
        org = self._organization(obj)
        return org is not None and may_view(request.user, org)

    def _may_manage(self, request: HttpRequest, obj: Any = None) -> bool:
        if is_operator(request.user):
            return True
        if self.tenant_path is None:
            return False
        if obj is None:
            return may_manage(request.user)
        org = self._organization(obj)
        return org is not None and may_manage(request.user, org)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self._may_manage(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_manage(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_manage(request, obj)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """For actions a platform operator alone may run: `@admin.action(permissions=["operate"])`."""
        return is_operator(request.user)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """The object as the form leaves it must belong to an organization the user may change: the
        forms' choices say so already; this holds whatever field a form may carry."""
        if not self._may_manage(request, obj):
            raise PermissionDenied
        super().save_model(request, obj, form, change)


class TenantInline(admin.TabularInline):
    """An inline of an organization-bound parent: the parent's organization decides."""

    def _allowed(self, request: HttpRequest, obj: Any, manage: bool) -> bool:
        if is_operator(request.user):
            return True
        parent = self.parent_model
        path = tenant_path_of(self.admin_site, parent)
        if path is False or path is None:
            return False
        org = organization_of(obj, path) if obj is not None else None  # type: ignore[arg-type]
        check = may_manage if manage else may_view
        return check(request.user, org)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, obj, manage=False)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, obj, manage=True)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, obj, manage=True)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, obj, manage=True)
