"""Numbers in the admin's forms are read as a manager writes them in pt-BR ("1.234,56", "1234,56",
"150,00", "150.00") and a malformed one is refused with the format, never read as something else:
"1.2.3,4" was 123,40. Property-based: any string of digits, dots, commas and a sign is either
refused or read as an independent reading of pt-BR numbers reads it."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import translation
from hypothesis import given
from hypothesis import strategies as st

from crm.models import Sale
from crm.number_input import LocalizedDecimalField, LocalizedFloatField


def _reading(text: str) -> Decimal | None:
    """pt-BR's numbers as a person reads them: thousands in groups of three after a dot, decimals
    after one comma; a lone dot not followed by exactly three digits is a decimal point."""
    sign = ""
    if text[:1] in "+-":
        sign, text = text[0], text[1:]
    whole, comma, decimals = text.partition(",")
    if comma and not decimals.isdigit():
        return None
    if not whole and not comma:
        return None
    groups = whole.split(".")
    if not comma and len(groups) == 2 and groups[0].isdigit() and groups[1].isdigit() and len(groups[1]) != 3:
        return Decimal(sign + groups[0] + "." + groups[1])
    if len(groups) > 1 and not (
        1 <= len(groups[0]) <= 3
        and groups[0].isdigit()
        and all(len(g) == 3 and g.isdigit() for g in groups[1:])
    ):
        return None
    digits = "".join(groups)
    if digits and not digits.isdigit():
        return None
    return Decimal(sign + (digits or "0") + "." + (decimals or "0"))


def _field() -> LocalizedDecimalField:
    return LocalizedDecimalField(localize=True, required=False)


def _grouped(n: int) -> str:
    return f"{n:,}".replace(",", ".")


@pytest.mark.parametrize(
    ("typed", "read"),
    [("1.234,56", "1234.56"), ("1234,56", "1234.56"), ("150,00", "150.00"), ("150.00", "150.00"),
     ("1.234", "1234"), ("-1.234.567,8", "-1234567.8"), (",5", "0.5"), ("99,9", "99.9")],
)  # fmt: skip
def test_well_formed_numbers_are_read(typed: str, read: str) -> None:
    with translation.override("pt-br"):
        assert _field().clean(typed) == Decimal(read)


@pytest.mark.parametrize(
    "typed",
    [
        "1.2.3,4",
        "12.34,5",
        "1234.567,8",
        "12.34.567",
        "1234.567",
        "1,2,3",
        "1.234,5.6",
        "1,234.56",
        "5,",
        ".",
        "1e3",
    ],
)
def test_malformed_numbers_are_refused_with_the_format(typed: str) -> None:
    with translation.override("pt-br"), pytest.raises(ValidationError) as refused:
        _field().clean(typed)
    assert "1.234,56" in refused.value.messages[0], refused.value.messages


@given(
    whole=st.integers(min_value=0, max_value=10**12),
    cents=st.integers(min_value=0, max_value=99),
    negative=st.booleans(),
    grouped=st.booleans(),
)
def test_any_well_formed_amount_reads_as_itself(
    whole: int, cents: int, negative: bool, grouped: bool
) -> None:
    amount = Decimal(whole) + Decimal(cents) / 100
    sign = "-" if negative else ""
    written = f"{sign}{_grouped(whole) if grouped else whole},{cents:02d}"
    with translation.override("pt-br"):
        assert _field().clean(written) == (-amount if negative else amount)
        assert _field().clean(f"{sign}{whole}.{cents:02d}") == (-amount if negative else amount)  # "150.00"
        assert LocalizedFloatField(localize=True).clean(written) == pytest.approx(
            float(-amount if negative else amount)
        )


@given(st.text(alphabet="0123456789.,-", min_size=1, max_size=14))
def test_any_typed_number_is_refused_or_read_as_a_person_reads_it(typed: str) -> None:
    expected = _reading(typed)
    with translation.override("pt-br"):
        try:
            read = _field().clean(typed)
        except ValidationError:
            read = None
    assert read == expected, (typed, read, expected)


@pytest.mark.django_db
def test_an_admin_form_refuses_a_malformed_total_and_says_how_to_write_it(admin_client, world) -> None:
    response = admin_client.post(
        "/admin/crm/sale/add/",
        {
            "organization": world["org"].pk,
            "store": world["store"].pk,
            "erp_id": "MAL-1",
            "total": "1.2.3,4",
            "sold_at_0": "2026-03-10",
            "sold_at_1": "15:30:00",
        },
        HTTP_ACCEPT_LANGUAGE="pt-br",
    )
    assert response.status_code == 200
    assert "Escreva o número como 1.234,56" in response.content.decode()
    assert not Sale.objects.filter(erp_id="MAL-1").exists()
