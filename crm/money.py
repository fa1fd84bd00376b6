"""Money as operators read it: one formatting for every page that shows a cost or a revenue."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django.utils.formats import number_format
from django.utils.translation import get_language, gettext

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


def cost_estimate(
    amount: Decimal, currency: str, *, rate: Decimal | None, rate_currency: str
) -> Decimal | None:
    """`amount` of `currency` in reais: itself when it is in reais, converted at the organization's
    `rate` when that rate is for `currency` — an estimate —, else None (never a guess)."""
    if currency.upper() == DEFAULT_CURRENCY:
        return amount
    if rate is None or rate_currency.upper() != currency.upper():
        return None
    return amount * rate


def format_cost(
    amount: Decimal | int | str | None,
    currency: str,
    *,
    rate: Decimal | None = None,
    rate_currency: str = "",
    places: int = 2,
) -> str:
    """A cost in its own currency, and, when it is not reais and a conversion rate for it is set,
    also in reais labelled as an estimate: "US$ 3,13 (≈ R$ 16,90, estimativa)"."""
    shown = format_money(amount, currency, places=places)
    if amount is None or amount == "" or currency.upper() == DEFAULT_CURRENCY:
        return shown
    estimate = cost_estimate(Decimal(str(amount)), currency, rate=rate, rate_currency=rate_currency)
    if estimate is None:
        return shown
    return gettext("%(cost)s (≈ %(estimate)s, estimate)") % {
        "cost": shown,
        "estimate": format_money(estimate, DEFAULT_CURRENCY, places=places),
    }
