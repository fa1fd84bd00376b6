"""Every admin list's query string checked before it reaches the database.

Django's list refuses most bad values itself (the list reloads with `?e=1`), but not all: a date
hierarchy's year past Python's range (`?sold_at__year=9999`, `=2147483648`) raises ValueError or
OverflowError outside Django's own check, a year lookup past 9999 fails when the query is built, and
a lookup on an IP address field reaches PostgreSQL's `inet` adapter, which raises ValueError on "0"
— each a 500. `CheckedChangeList` refuses them like
any other bad value; TenantAdmin (every project admin) and the login-lockout pages
(crm/admin_thirdparty.py) use it."""

from __future__ import annotations

import ipaddress
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import FieldDoesNotExist
from django.db.models import GenericIPAddressField
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest

# The lookups PostgreSQL compares as inet values; the text ones (contains, startswith...) take any text.
_ADDRESS_LOOKUPS = {"", "exact", "in", "gt", "gte", "lt", "lte", "range"}


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _flat(value: Any) -> list[str]:
    """A prepared lookup's values: one per query-string value, a list for `__in` and `__range`."""
    if isinstance(value, list | tuple):
        return [part for item in value for part in _flat(item)]
    return str(value).split(",")


class CheckedChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        """A lookup PostgreSQL cannot be asked (a year past 9999 in `date_joined__year`) fails only
        when the query is built: with lookups in the query string, refused like any bad value."""
        try:
            super().get_results(request)
        except (ValueError, OverflowError) as exc:
            if not self.get_filters_params():
                raise
            raise IncorrectLookupParameters(exc) from exc

    def get_filters(self, request: HttpRequest) -> Any:
        try:
            filters = super().get_filters(request)
        except (ValueError, OverflowError) as exc:  # a date hierarchy's year out of range
            raise IncorrectLookupParameters(exc) from exc
        for key, values in filters[2].items():
            name, _, lookup = key.partition(LOOKUP_SEP)
            try:
                field = self.model._meta.get_field(name)
            except FieldDoesNotExist:
                continue
            if not isinstance(field, GenericIPAddressField) or lookup not in _ADDRESS_LOOKUPS:
                continue
            if not all(_is_address(part) for part in _flat(values)):
                raise IncorrectLookupParameters(f"{key}: not an IP address")
        return filters


class CheckedLists(admin.ModelAdmin):
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CheckedChangeList
