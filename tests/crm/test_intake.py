"""Strict JSON at every intake: whatever arrives, the parser either returns plain JSON that
PostgreSQL's jsonb can store or refuses it with a 4xx — never an exception that would be a 500."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crm import intake

HOSTILE = [
    (b"", "empty"),
    (b"   ", "empty"),
    (b"null", None),
    (b'{"a": "x\\u0000y"}', "NUL"),
    (b'{"a\\u0000": 1}', "NUL"),
    (b'{"a": "\\ud800"}', "surrogate"),
    (b'{"\\udfff": 1}', "surrogate"),
    (b'{"a": NaN}', "NaN"),
    (b'{"a": -Infinity}', "Infinity"),
    (b'{"a": 1e400}', "out of range"),
    (b'{"a": ' + b"9" * 5000 + b"}", "digits"),
    (b"[" * 100_000 + b"]" * 100_000, "nested"),
    (b'{"a":' * 40 + b"1" + b"}" * 40, "nested"),
    (b"\xff\xfe{}", "UTF-8"),
    (b'{"a": 1', "not JSON"),
]


@pytest.mark.parametrize(("body", "said"), HOSTILE)
def test_hostile_bodies_are_refused_with_a_400_saying_why(body, said):
    if said is None:  # valid JSON, but not an object
        with pytest.raises(intake.BadBody, match="must be a JSON object") as info:
            intake.json_object(body)
    else:
        with pytest.raises(intake.BadBody, match=said) as info:
            intake.parse_json(body)
    assert info.value.status == 400


def test_nesting_up_to_the_limit_is_accepted():
    body = b'{"a":' * (intake.MAX_DEPTH - 1) + b"1" + b"}" * (intake.MAX_DEPTH - 1)
    assert isinstance(intake.parse_json(body), dict)
    assert intake.parse_json(b'{"s": "[[[[{{{{ not brackets"}') == {"s": "[[[[{{{{ not brackets"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


def _plain(value) -> bool:
    """What jsonb and the parser accept: finite numbers, text without NUL or lone surrogates."""
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, int) and not isinstance(value, bool):
        return len(str(abs(value))) <= intake.MAX_INT_DIGITS
    if isinstance(value, str):
        return "\x00" not in value and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return True


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_any_json_value_is_parsed_back_exactly_or_refused(value):
    body = json.dumps(value, ensure_ascii=True, allow_nan=True).encode()
    try:
        parsed = intake.parse_json(body)
    except intake.BadBody as exc:
        assert exc.status == 400
        assert not _plain(value)
    else:
        assert _plain(value)
        assert json.dumps(parsed) == json.dumps(value)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_any_bytes_are_parsed_or_refused_never_an_unexpected_error(raw):
    try:
        intake.parse_json(raw)
    except intake.BadBody as exc:
        assert exc.status == 400
