"""A customer's first name, one rule for every message (WhatsApp and email campaigns, surveys)."""

from __future__ import annotations

from integrations.text import fold_whitespace


def first_name(name: str) -> str:
    """The first word of `name` that has a letter, as a greeting writes it; "" when no word has one
    (the caller's fallback applies: a skipped message, "cliente"...).

    White space is folded first (integrations.text, as for WhatsApp template parameters), so a
    leading space, a tab or a line break never makes it empty nor leaks into a template parameter.
    A word written all in capitals or all in lower case, as ERPs and hurried typists do ("MARIA DA
    SILVA", "maria"), is capitalized ("Maria", "Ana-Luiza", "D'Ávila"); mixed case is the person's
    own ("McCartney", "DeAndré") and is kept. Words without letters (an emoji, a dash) are passed
    over.
    """
    for word in fold_whitespace(name).split(" "):
        if any(ch.isalpha() for ch in word):
            return word.title() if word.isupper() or word.islower() else word
    return ""
