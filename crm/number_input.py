"""Numbers typed in the locale's format, read only when they are well formed.

Django's localized number fields (`localize=True`) read "1.234,56" by deleting every thousands
separator (`formats.sanitize_separators`), so a mistyped "1.2.3,4" is quietly 123,4. These fields
take what a person writes in the active language ("1.234,56", "1234,56", "150,00" in pt-BR, and
"150.00": a lone dot not followed by three digits is the decimal point, as Django reads it) and
refuse anything else with an error that shows the format."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import formats
from django.utils.translation import gettext as _


def _pattern(decimal: str, group: str) -> re.Pattern[str]:
    d, g = re.escape(decimal), re.escape(group)
    whole = rf"(?:\d+|\d{{1,3}}(?:{g}\d{{3}})+)" if settings.USE_THOUSAND_SEPARATOR and group else r"\d+"
    forms_ = [rf"{whole}(?:{d}\d+)?", rf"{d}\d+"]
    if group == "." and decimal != ".":
        forms_.append(r"\d+\.(?:\d{1,2}|\d{4,})")  # "150.00": Django's reading of a lone dot
    return re.compile(rf"[+-]?(?:{'|'.join(forms_)})")


def check_number(value: str) -> None:
    """Raise a ValidationError unless `value` is a number well written in the active language."""
    decimal = str(formats.get_format("DECIMAL_SEPARATOR"))
    group = str(formats.get_format("THOUSAND_SEPARATOR"))
    if not _pattern(decimal, group).fullmatch(value):
        example = formats.number_format(Decimal("1234.56"), decimal_pos=2, force_grouping=True)
        raise ValidationError(
            _(
                "Write the number as %(example)s: digits, the thousands in groups of three after "
                "“%(group)s” (optional), the decimals after “%(decimal)s”."
            )
            % {"example": example, "group": group, "decimal": decimal},
            code="invalid",
        )


class _WellFormed:
    localize: bool

    def to_python(self, value: Any) -> Any:
        if self.localize and isinstance(value, str) and value.strip():
            check_number(value.strip())
        return super().to_python(value)  # type: ignore[misc]


class LocalizedDecimalField(_WellFormed, forms.DecimalField):
    """A forms.DecimalField that refuses a malformed localized number (see the module)."""


class LocalizedFloatField(_WellFormed, forms.FloatField):
    """A forms.FloatField that refuses a malformed localized number (see the module)."""
