"""Money as operators read it: one formatting for every page that shows a cost or a revenue."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django.utils.formats import number_format
from django.utils.translation import get_language

# Amounts the platform records (WhatsApp rate cards, sales) are in reais unless they say otherwise.
DEFAULT_CURRENCY = "BRL"
_SYMBOLS = {"BRL": "R$", "USD": "US$", "EUR": "€"}


def format_money(
    amount: Decimal | int | str | None, currency: str = DEFAULT_CURRENCY, *, places: int = 2
) -> str:
    """The amount with its currency in the active language's number format: "R$ 3,13" (pt-BR),
    "R$3.13" (en), as the browsers' Intl.NumberFormat writes them (a no-break space in pt-BR).
    None and "" read "—"."""
    if amount is None or amount == "":
        return "—"
    # Half away from zero, as Intl.NumberFormat rounds in the charts (number_format would round half even).
    value = Decimal(str(amount)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    symbol = _SYMBOLS.get(currency.upper(), currency.upper())
    number = number_format(abs(value), decimal_pos=places, use_l10n=True, force_grouping=True)
    separator = (
        "\u00a0" if (get_language() or "").lower().startswith("pt") or symbol == currency.upper() else ""
    )
    return f"{'-' if value < 0 else ''}{symbol}{separator}{number}"
