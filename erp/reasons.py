"""Why the ERP sync refused a record, in the reader's language.

An issue keeps its reason as a message id (untranslated, marked with gettext_noop) and the values
that fill it, beside the English sentence; it is shown with gettext at read time, so a manager in
pt-BR and an operator in English read the same issue each in their own language. An issue stored
before the ids were kept (English text only) is matched back to its message id by shape."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from functools import cache

from django.utils.translation import gettext, gettext_noop

from integrations.millennium.client import RECORD_MESSAGES

SALE_OF_ANOTHER_STORE = gettext_noop("a sale of store %(store)s answered for store %(asked)s")
SOLD_IN_THE_FUTURE = gettext_noop("sold in the future: %(sold_at)s is ahead of the sync's clock")
MESSAGES = (*RECORD_MESSAGES, SALE_OF_ANOTHER_STORE, SOLD_IN_THE_FUTURE)

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


@cache
def _shapes() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """Each message id with a pattern of its English sentence (a placeholder: any text)."""
    shapes = []
    for message in MESSAGES:
        parts = _PLACEHOLDER.split(message)  # text, name, text, name, ..., text
        pattern = "".join(
            re.escape(part) if i % 2 == 0 else f"(?P<{part}>.+?)" for i, part in enumerate(parts)
        )
        shapes.append((message, re.compile(pattern, re.DOTALL)))
    # The most literal text first: "no x is not text: 'y'" is a text that is not, not a missing one.
    return tuple(sorted(shapes, key=lambda shape: -len(_PLACEHOLDER.sub("", shape[0]))))


def reason_parse(text: str) -> tuple[str, dict[str, str]]:
    """The message id and values of an English reason, or ("", {}) when it has no known shape."""
    for message, pattern in _shapes():
        match = pattern.fullmatch(text)
        if match:
            return message, match.groupdict()
    return "", {}


def reason_text(*, code: str, params: Mapping[str, str], english: str) -> str:
    """The reason in the active language: its message id translated and filled, else the English
    sentence read back to its id, else the sentence as stored."""
    if not code:
        code, params = reason_parse(english)
        if not code:
            return english
    try:
        return gettext(code) % dict(params)
    except (KeyError, TypeError, ValueError):  # values that do not fill it: what was stored
        return english


def _folded(text: str) -> str:
    """Case and accents aside: "Relógio" and "relogio" read the same."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def codes_containing(word: str) -> list[str]:
    """The message ids whose sentence in the active language holds `word` (case and accents aside)
    outside its placeholders: the reasons a reader finds by a word they read on the list."""
    wanted = _folded(word)
    if not wanted:
        return []
    return [m for m in MESSAGES if wanted in _folded(_PLACEHOLDER.sub("\x00", gettext(m)))]


def english_pattern(codes: list[str]) -> str:
    """A PostgreSQL regular expression of these message ids' English sentences (a placeholder: any
    text), to find the issues stored before the ids were kept (`reason` only)."""
    sentences = (
        "".join(re.escape(part) if i % 2 == 0 else ".+" for i, part in enumerate(_PLACEHOLDER.split(code)))
        for code in codes
    )
    return "^(?:" + "|".join(sentences) + ")$"
