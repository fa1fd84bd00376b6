"""A read-only relation on a change page links to its object only for a reader who may open it.

Django's `AdminReadonlyField` renders every read-only foreign key (and one-to-one) as a link to the
related object's change page without asking whether the reader may open it: a store manager on a
handler's page (its integration type read-only for them, a platform model) followed a link that
answered 403. Django hands the field no request, so TenantAdmin's change form leaves the request on
its forms (`remember_reader`) and the one override below asks the related model's admin for view
(or change) permission on that object; a field of a form nobody marked shows the object's name.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin import helpers
from django.db.models import Model
from django.http import HttpRequest

_READER = "_crm_admin_reader"  # the request, on a change page's forms (inline forms too)
_django_get_admin_url = helpers.AdminReadonlyField.get_admin_url  # type: ignore[attr-defined]


def remember_reader(request: HttpRequest, context: dict[str, Any]) -> None:
    """Mark the forms of a change page's context (`render_change_form`) with who reads them."""
    forms = [context["adminform"].form] if "adminform" in context else []
    for inline in context.get("inline_admin_formsets") or ():
        forms.extend(inline.formset.forms)
    for form in forms:
        setattr(form, _READER, request)


def may_open(request: HttpRequest, site: Any, model: type[Model], obj: Model) -> bool:
    """The reader may open `obj`'s change page: its model has an admin that lets them view or change it."""
    model_admin = site._registry.get(model)
    return model_admin is not None and (
        model_admin.has_view_permission(request, obj) or model_admin.has_change_permission(request, obj)
    )


def _get_admin_url(self: Any, remote_field: Any, remote_obj: Model) -> str:
    request = getattr(self.form, _READER, None)
    if request is None or not may_open(request, self.model_admin.admin_site, remote_field.model, remote_obj):
        return str(remote_obj)  # escaped by contents(), as Django's own text when the URL is missing
    return _django_get_admin_url(self, remote_field, remote_obj)


# The one override of Django's admin helpers: every change page of the project goes through it.
helpers.AdminReadonlyField.get_admin_url = _get_admin_url  # type: ignore[attr-defined]
