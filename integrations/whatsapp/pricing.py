"""Meta's rate card as data: parse a CSV of prices per category and recipient country.

Format (header required): `country,category,price,currency` — country an ISO 3166 alpha-2 code
or `*` for "any other country", category marketing/utility/authentication/service, price a
decimal per message. Meta publishes its rate cards as spreadsheets; export or map them to this.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

CATEGORIES = {"marketing", "utility", "authentication", "service"}


@dataclass(frozen=True)
class Rate:
    country: str
    category: str
    price: Decimal
    currency: str


def parse_rate_card(text: str) -> tuple[list[Rate], list[str]]:
    """(rates, problems): every valid row, and one line per row that was skipped and why."""
    reader = csv.DictReader(io.StringIO(text))
    missing = {"country", "category", "price"} - set(reader.fieldnames or [])
    if missing:
        raise ValueError(f"rate card lacks column(s): {', '.join(sorted(missing))}")
    rates: list[Rate] = []
    problems: list[str] = []
    for line, row in enumerate(reader, start=2):
        country = (row.get("country") or "").strip().upper()
        category = (row.get("category") or "").strip().lower()
        currency = (row.get("currency") or "USD").strip().upper() or "USD"
        if not (len(currency) == 3 and currency.isascii() and currency.isalpha()):
            problems.append(f"line {line}: currency {currency!r} is not an ISO 4217 code")
            continue
        if rates and currency != rates[0].currency:
            # Costs add up per campaign: one card, one currency, so no total ever adds two.
            problems.append(f"line {line}: currency {currency} differs from the card's {rates[0].currency}")
            continue
        if country != "*" and not (len(country) == 2 and country.isalpha()):
            problems.append(f"line {line}: country {country!r} is not an ISO code or *")
            continue
        if category not in CATEGORIES:
            problems.append(f"line {line}: unknown category {category!r}")
            continue
        try:
            price = Decimal((row.get("price") or "").strip())
        except InvalidOperation:
            problems.append(f"line {line}: price {row.get('price')!r} is not a number")
            continue
        if price < 0:
            problems.append(f"line {line}: negative price")
            continue
        rates.append(Rate(country, category, price, currency))
    return rates, problems


def rate_category(meta_category: str) -> str | None:
    """The rate card's category for the `pricing.category` of a Meta status webhook, or None.

    Meta names variants of a category with a suffix ("marketing_lite",
    "authentication_international"); they are charged from the category's row here. Anything else
    ("referral_conversion", free entry points, an unknown name) has no price on the card."""
    category = meta_category.strip().lower()
    if category in CATEGORIES:
        return category
    base = category.split("_", 1)[0]
    return base if base in CATEGORIES else None
