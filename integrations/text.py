"""Text from people and ERPs made safe to put in a message (pure: a value in, a value out)."""

from __future__ import annotations

import unicodedata

# Invisible characters that are not white space to Python: zero-width space, word joiner, byte
# order mark, soft hyphen. Left in, a name made only of them would look empty and not be.
_INVISIBLE = frozenset("\u200b\u2060\ufeff\u00ad")
_DROPPED_CATEGORIES = frozenset({"Cc", "Cs"})  # control characters (white space excepted), lone surrogates


def fold_whitespace(text: str) -> str:
    """`text` with every run of white space (spaces, tabs, new-lines, unicode spaces) made one space,
    control and invisible characters dropped, and no space at either end."""
    if text.isprintable() and _INVISIBLE.isdisjoint(text):
        # Nothing to drop (no control, format or separator character but the space): most names
        # and values are, and this takes a tenth of the time of looking at each character.
        return " ".join(text.split())
    kept = "".join(
        ch
        for ch in text
        if ch.isspace() or not (ch in _INVISIBLE or unicodedata.category(ch) in _DROPPED_CATEGORIES)
    )
    return " ".join(kept.split())


EXCERPT_CHARS = 300


def excerpt(text: str, *, limit: int = EXCERPT_CHARS) -> str:
    """A short excerpt of what a provider answered, for a record or a page: white space folded,
    control characters dropped, at most `limit` characters ("…" when cut). Escaping is the page's."""
    folded = fold_whitespace(text)
    return folded if len(folded) <= limit else folded[: limit - 1] + "…"
