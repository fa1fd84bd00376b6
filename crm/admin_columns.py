"""Compact changelist columns, so list pages fit a 1366-px screen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.formats import date_format, number_format


def short_datetime(name: str, label: Any) -> Callable[[Any], str]:
    """A list_display column of the datetime field `name` as "02/12/2026 03:18" (the language's
    SHORT_DATETIME_FORMAT, current time zone) instead of "2 de Dezembro de 2026 às 03:18"; sorts
    by the field. Its column keeps the field's name (CSS class field-<name>)."""

    @admin.display(description=label, ordering=name)
    def column(obj: Any) -> str:
        value = getattr(obj, name)
        return "—" if value is None else date_format(timezone.localtime(value), "SHORT_DATETIME_FORMAT")

    column.__name__ = name
    return column


def elapsed(start: str, end: str, label: Any) -> Callable[[Any], str]:
    """A list_display column of the time from the datetime field `start` to `end` as a person reads
    it — "0,2 s", "3 min 05 s", "1 h 02 min" — instead of Python's "0:00:00.198396"; sorts by `end`."""

    @admin.display(description=label, ordering=end)
    def column(obj: Any) -> str:
        began, ended = getattr(obj, start), getattr(obj, end)
        if began is None or ended is None:
            return "—"
        seconds = max(0.0, (ended - began).total_seconds())
        if seconds < 60:
            return f"{number_format(round(seconds, 1), decimal_pos=1, use_l10n=True)} s"
        minutes, second = divmod(round(seconds), 60)
        if minutes < 60:
            return f"{minutes} min {second:02d} s"
        return f"{minutes // 60} h {minutes % 60:02d} min"

    column.__name__ = "duration"
    return column
