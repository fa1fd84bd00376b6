"""Phone numbers as WhatsApp takes them: E.164 for a Brazilian-first customer base, and the
country of a number for Meta's per-country prices. Plain values in and out."""

from __future__ import annotations

import functools
import re

import phonenumbers


def normalize_phone(raw: str) -> str | None:
    """E.164 for a Brazilian-first customer base: 55 added when missing; a mobile without its ninth
    digit (old 8-digit form) gets it. None when it cannot be a valid number.

    A Brazilian mobile already in E.164 (what most stored phones are: crm.models.Customer.phone)
    is recognized by phonenumbers' own patterns for it without a parse, ~1 µs instead of ~20 (a
    send batch normalizes every recipient's phone); anything else is parsed."""
    if _brazilian_mobile_e164().match(raw):
        return raw
    return _parsed(raw)


@functools.cache
def _brazilian_mobile_e164() -> re.Pattern[str]:
    """+55 and 11 national digits that phonenumbers' metadata for Brazil holds valid (its general
    pattern) and a mobile: such a number is its own E.164 form (no national prefix can begin it, no
    ninth digit is missing). Matches nothing should the metadata's lengths ever exclude 11."""
    metadata = phonenumbers.PhoneMetadata.metadata_for_region("BR")
    assert metadata is not None and metadata.general_desc is not None and metadata.mobile is not None
    general, mobile = metadata.general_desc, metadata.mobile
    if 11 not in general.possible_length or 11 not in mobile.possible_length:
        return re.compile(r"(?!)")
    valid = rf"(?=(?:{general.national_number_pattern})\Z)"
    return re.compile(rf"\+55{valid}(?=\d{{11}}\Z)(?:{mobile.national_number_pattern})\Z", re.ASCII)


def _parsed(raw: str) -> str | None:
    digits = "".join(ch for ch in raw if ch.isdigit())
    if not digits:
        return None
    international = raw.strip().startswith("+") or (digits.startswith("55") and len(digits) >= 12)
    candidate = "+" + digits if international else "+55" + digits
    try:
        parsed = phonenumbers.parse(candidate)
    except phonenumbers.NumberParseException:
        return None
    national = str(parsed.national_number)
    if parsed.country_code == 55 and len(national) == 10 and national[2] in "6789":
        # 8-digit mobile from before 2016: add the ninth digit
        parsed = phonenumbers.parse(f"+55{national[:2]}9{national[2:]}")
    if not phonenumbers.is_valid_number(parsed):
        return None
    return phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164)


@functools.lru_cache(maxsize=4096)
def _region_of_prefix(prefix: str) -> str | None:
    region = phonenumbers.region_code_for_country_code(int(prefix))
    return None if region == phonenumbers.UNKNOWN_REGION else region


def phone_region(e164: str) -> str:
    """The ISO country of an E.164 number from its calling code ("*" when shared or unknown).

    Calling codes are prefix-free (1 to 3 digits), so no full parse is needed for pricing."""
    digits = e164.lstrip("+")
    for size in (1, 2, 3):
        region = _region_of_prefix(digits[:size])
        if region:
            return region if region != "001" else "*"
    return "*"
