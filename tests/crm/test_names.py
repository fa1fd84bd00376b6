"""The one first-name rule: names as people type them and as ERPs export them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crm.names import first_name
from integrations.text import fold_whitespace


@pytest.mark.parametrize(
    ("name", "first"),
    [
        ("Maria da Silva", "Maria"),
        ("MARIA DA SILVA", "Maria"),  # ERP upper case
        ("JOÃO\tSOUZA", "João"),
        ("maria", "Maria"),
        (" Maria", "Maria"),  # a leading space no longer makes it empty (and skips the customer)
        ("\tAna\nPaula", "Ana"),
        ("\r\nPEDRO  HENRIQUE", "Pedro"),
        ("Ana     Paula", "Ana"),
        ("\u00a0Bia", "Bia"),
        ("ANA-LUIZA COSTA", "Ana-Luiza"),
        ("D'ÁVILA", "D'Ávila"),
        ("McCartney Paul", "McCartney"),  # mixed case is the person's own
        ("DeAndré", "DeAndré"),
        ("💖 Bia", "Bia"),
        ("Ju💖", "Ju💖"),
        ("- Carla", "Carla"),
        ("李 小龙", "李"),
        ("Xavier" * 33, "Xavier" * 33),  # a very long first word is kept whole (Meta's limit is 1,024)
        ("", ""),
        ("   ", ""),
        ("\t\n", ""),
        ("😀 🎉", ""),
        ("\u200b", ""),
    ],
)
def test_the_first_name_of_a_name_as_typed(name: str, first: str) -> None:
    assert first_name(name) == first


@settings(max_examples=300, deadline=None)
@given(
    name=st.text(
        alphabet=st.one_of(st.characters(), st.sampled_from(" \t\n\r\u00a0\u3000\u200bMARIA")), max_size=300
    )
)
def test_a_first_name_is_one_word_with_a_letter_or_nothing(name: str) -> None:
    first = first_name(name)
    assert not any(ch.isspace() for ch in first)
    has_letter = any(ch.isalpha() for ch in fold_whitespace(name))
    assert bool(first) is has_letter
    if first:
        assert any(ch.isalpha() for ch in first)
