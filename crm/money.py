"""Money as people read it: one place that writes an amount in reais."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django.utils import formats

CURRENCY_SYMBOL = "R$"
CENT = Decimal("0.01")


def brl(value: Decimal | int | None) -> str:
    """`value` in reais with two decimals in the active language: "R$ 1.234,50" in pt-BR,
    "R$ 1,234.50" in English; the space is a no-break space (the symbol never wraps away from the
    number) and a minus comes first ("-R$ 3,13"), rounded half up to the cent. None is "—"."""
    if value is None:
        return "—"
    # Rounded to the cent here: number_format would cut 0.125 to 0,12.
    amount = Decimal(value).quantize(CENT, rounding=ROUND_HALF_UP)
    number = formats.number_format(abs(amount), decimal_pos=2, use_l10n=True, force_grouping=True)
    return f"{'-' if amount < 0 else ''}{CURRENCY_SYMBOL}\u00a0{number}"
