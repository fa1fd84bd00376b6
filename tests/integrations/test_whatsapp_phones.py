"""integrations.whatsapp.phones.normalize_phone: the shortcut for a Brazilian mobile already in
E.164 answers exactly what phonenumbers' full parse answers, for any input."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from integrations.whatsapp.phones import _parsed, normalize_phone

digits = st.text("0123456789", min_size=0, max_size=14)
brazilian = st.builds(
    lambda area, rest: f"+55{area}{rest}",
    st.integers(10, 99).map(str),
    st.text("0123456789", min_size=8, max_size=10)
    | st.text("0123456789", min_size=8, max_size=8).map("9".__add__),
)


@given(phone=brazilian | digits.map("+55".__add__) | digits | st.text(max_size=20))
@example(phone="+5511987654321")  # a mobile in São Paulo: the shortcut
@example(phone="+5511387654321")  # a landline: parsed
@example(phone="+5520987654321")  # no area code 20: invalid either way
@example(phone="+5590987654321")  # "90" would be a national prefix: never the shortcut
@example(phone="+55119876543210")  # 12 national digits
@example(phone="+5511987654321\n")
@example(phone=" +5511987654321")
@example(phone="+5511\uff1987654321")  # a full-width digit
@example(phone="11987654321")
def test_the_shortcut_agrees_with_the_full_parse(phone):
    assert normalize_phone(phone) == _parsed(phone)


def test_a_stored_mobile_is_its_own_e164_form_and_an_old_one_gets_its_ninth_digit():
    assert normalize_phone("+5511987654321") == "+5511987654321"
    assert normalize_phone("(11) 8765-4321") == "+5511987654321"
    assert normalize_phone("+55 11 98765-4321") == "+5511987654321"
    assert normalize_phone("not a phone") is None
