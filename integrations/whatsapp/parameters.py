"""Template parameter text as Meta accepts it (pure: a value in, a value out).

Meta's documented rules for a template's text parameters:

- WhatsApp error codes (https://developers.facebook.com/documentation/business-messaging/whatsapp/
  support/error-codes/), code 132018, "There was an issue with the parameters in your template":
  "Param text cannot have new-line/tab characters or more than 4 consecutive spaces".
- Cloud API reference, messages, parameter object, `text`
  (https://developers.facebook.com/docs/whatsapp/cloud-api/reference/messages#parameter-object):
  the text of a body parameter is limited to 1,024 characters when the template has other
  components (a header, buttons) and 32,768 when the body is its only component; a header's to 60.
  Our campaign templates carry URL buttons, so 1,024 is the body limit that always holds.

Names typed by people and imported from ERPs break the first rule ("Maria\tSilva", "JOSÉ\r\nDA
SILVA", "Ana     Paula"), so every text parameter goes through `template_text` on its way out
(`client.build_payload`), and callers that must know whether a value is empty ask it first. The
white space folding itself (`integrations.text.fold_whitespace`) is shared with email and names.
"""

from __future__ import annotations

from integrations.text import fold_whitespace

BODY_TEXT_MAX = 1024
HEADER_TEXT_MAX = 60
ELLIPSIS = "…"


def text_length(text: str) -> int:
    """Length in UTF-16 code units: an emoji outside the basic plane counts twice, so a text within a
    limit by this count is within it however Meta counts characters."""
    return len(text.encode("utf-16-le")) // 2


def template_text(value: str, *, limit: int = BODY_TEXT_MAX) -> str:
    """`value` as a text parameter Meta accepts: white space folded (never a new-line, a tab nor two
    spaces in a row), trimmed, and at most `limit` characters (`text_length`); a longer text is cut,
    at a word when one ends in its second half, and ends in "…". "" stays "" (the caller decides)."""
    if limit < 1:
        raise ValueError("limit must be 1 or more")
    text = fold_whitespace(value)
    if text_length(text) <= limit:
        return text
    room = limit - text_length(ELLIPSIS)
    cut, used = 0, 0
    for ch in text:
        size = text_length(ch)
        if used + size > room:
            break
        used += size
        cut += 1
    head = text[:cut]
    space = head.rfind(" ")
    if space > len(head) // 2:
        head = head[:space]
    # A cut inside an emoji sequence leaves a joiner with nothing to join.
    return head.rstrip(" \u200d") + ELLIPSIS
