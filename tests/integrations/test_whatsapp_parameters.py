"""Template parameters as Meta accepts them: names as people type them, and any unicode at all."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from integrations.text import fold_whitespace
from integrations.whatsapp.client import TemplateMessage, build_payload
from integrations.whatsapp.errors import Action, classify
from integrations.whatsapp.parameters import (
    BODY_TEXT_MAX,
    ELLIPSIS,
    HEADER_TEXT_MAX,
    template_text,
    text_length,
)

# What Meta refuses (132018): a new-line or a tab, or more than four consecutive spaces. Every line
# break and every white space Python knows is checked, not only "\n" and "\t".
REFUSED = re.compile(r"[\n\r\t\v\f\x85\u2028\u2029]| {5,}")

# Any character at all, lone surrogates included, with white space and invisible characters over-
# represented so that runs of them are common.
SPACES = " \t\n\r\x0b\x0c\x1c\x85\xa0\u1680\u2000\u2007\u200a\u2028\u2029\u202f\u205f\u3000\u200b\ufeff\u00ad"
ANY_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(),
        st.characters(categories=["Cs", "Cc", "Cf", "Zs", "Zl", "Zp"]),
        st.sampled_from(SPACES),
        st.sampled_from("😀👩‍👩‍👧MARIA da Silva"),
    ),
    max_size=3000,
)


@settings(max_examples=400, deadline=None)
@given(value=ANY_TEXT, limit=st.sampled_from([1, 2, 5, HEADER_TEXT_MAX, BODY_TEXT_MAX]))
@example(value="a" * 5000, limit=BODY_TEXT_MAX)
@example(value="😀" * 2000, limit=BODY_TEXT_MAX)
@example(value="ab " * 2000, limit=BODY_TEXT_MAX)
def test_a_normalized_parameter_is_always_one_meta_accepts(value: str, limit: int) -> None:
    text = template_text(value, limit=limit)
    assert not REFUSED.search(text)
    assert "  " not in text and text == text.strip()
    assert text_length(text) <= limit
    assert template_text(text, limit=limit) == text  # normalizing twice changes nothing
    assert not any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)  # JSON-encodable as UTF-8
    if text_length(fold_whitespace(value)) <= limit:
        assert text == fold_whitespace(value)  # nothing is cut that fits
    else:
        assert text.endswith(ELLIPSIS)


@pytest.mark.parametrize(
    ("typed", "sent"),
    [
        ("\tMaria", "Maria"),
        ("Maria\tda Silva", "Maria da Silva"),
        ("JOSÉ\r\nDA SILVA", "JOSÉ DA SILVA"),
        ("Ana     Paula", "Ana Paula"),
        ("  Pedro  ", "Pedro"),
        ("Bia\u00a0\u00a0\u00a0\u00a0\u00a0Souza", "Bia Souza"),  # no-break spaces from a spreadsheet
        ("Lu\u2028Lima", "Lu Lima"),
        ("\u200bCarla\ufeff", "Carla"),
        ("Ju 💖✨", "Ju 💖✨"),
        ("👩‍👩‍👧 Família", "👩‍👩‍👧 Família"),
        ("", ""),
        ("   \t\n  ", ""),
        ("\u200b\u200b", ""),
    ],
)
def test_names_as_people_type_them_become_parameters_meta_accepts(typed: str, sent: str) -> None:
    assert template_text(typed) == sent


def test_a_text_over_the_limit_is_cut_at_a_word_with_an_ellipsis() -> None:
    name = "Maria " * 300
    text = template_text(name)
    assert text_length(text) <= BODY_TEXT_MAX and text.endswith("Maria…")
    assert template_text("Ana Beatriz Carvalho", limit=12) == "Ana Beatriz…"
    # One long word is cut where it must; an emoji counts as Meta may count it (two code units).
    assert template_text("x" * 2000, limit=10) == "x" * 9 + ELLIPSIS
    assert template_text("😀" * 10, limit=10) == "😀" * 4 + ELLIPSIS
    with pytest.raises(ValueError, match="limit"):
        template_text("x", limit=0)


def test_the_payload_carries_normalized_body_parameters_whoever_builds_the_message() -> None:
    payload = build_payload(
        TemplateMessage(to="5511999990001", template="t", language="pt_BR", body=["\tAna\nSilva", "x" * 2000])
    )
    [body] = payload["template"]["components"]
    texts = [p["text"] for p in body["parameters"]]
    assert texts[0] == "Ana Silva"
    assert text_length(texts[1]) == BODY_TEXT_MAX


def test_132018_fails_one_message_and_configuration_errors_still_stop_the_campaign() -> None:
    assert classify(code=132018, status=400) is Action.DROP_RECIPIENT
    assert classify(code=132005, status=400) is Action.DROP_RECIPIENT
    for config_error in (132000, 132001, 132012):
        assert classify(code=config_error, status=400) is Action.STOP_CAMPAIGN


def _fold_char_by_char(text: str) -> str:
    """fold_whitespace's rule, looking at every character (what its shortcut must agree with)."""
    kept = "".join(
        ch
        for ch in text
        if ch.isspace() or not (ch in "\u200b\u2060\ufeff\u00ad" or unicodedata.category(ch) in ("Cc", "Cs"))
    )
    return " ".join(kept.split())


@given(text=st.text(max_size=60) | st.text(st.characters(codec="latin-1"), max_size=60))
@example(text="Maria  da\u00a0Silva")  # a no-break space: not printable, folded
@example(text="Jo\u00e3o\u200b")  # printable but for the zero-width space
@example(text="\u3164")  # a Hangul filler: printable, kept as it is
def test_folding_takes_its_shortcut_only_where_it_agrees(text):
    assert fold_whitespace(text) == _fold_char_by_char(text)
