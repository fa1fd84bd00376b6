"""crm.money.format_money: the one way money is written on the pages."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import translation

from crm.money import format_money


@pytest.mark.parametrize(
    ("language", "amount", "written"),
    [
        ("pt-br", Decimal("3.125"), "R$\u00a03,13"),  # half away from zero, as the charts' Intl does
        ("pt-br", Decimal("12345.6"), "R$\u00a012.345,60"),
        ("pt-br", Decimal("-1"), "-R$\u00a01,00"),
        ("en", Decimal("3.125"), "R$3.13"),
        ("en", Decimal("12345.6"), "R$12,345.60"),
    ],
)
def test_it_writes_the_currency_in_the_language_of_the_page(language, amount, written):
    with translation.override(language):
        assert format_money(amount) == written


def test_it_keeps_places_asked_for_and_names_an_unknown_currency_by_its_code():
    with translation.override("pt-br"):
        assert format_money(Decimal("0.0625"), places=4) == "R$\u00a00,0625"
        assert format_money(Decimal("2"), "usd") == "US$\u00a02,00"
    with translation.override("en"):
        assert format_money(Decimal("2"), "GBP") == "GBP\u00a02.00"
        assert format_money(None) == "—"
