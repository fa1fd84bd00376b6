"""Meta's error answers: whose fault each code is (the account's, one number's, one message's)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from integrations.whatsapp.client import _error_from
from integrations.whatsapp.errors import Action, classify

ACCOUNT = (131031, 131042, 368)
NUMBER = (0, 3, 10, 190, 33, 131037, 131045, 131048, 133010, 200, 250, 299)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
error_bodies = st.fixed_dictionaries(
    {},
    optional={
        "error": st.fixed_dictionaries(
            {},
            optional={
                "code": st.integers(min_value=-1, max_value=200_000) | json_values,
                "message": json_values,
                "error_data": st.fixed_dictionaries({}, optional={"details": json_values}) | json_values,
            },
        )
        | json_values
    },
)


def test_account_errors_pause_the_organization_and_number_errors_only_the_number():
    for code in ACCOUNT:
        assert classify(code=code, status=400) is Action.STOP_ORGANIZATION
    for code in NUMBER:
        assert classify(code=code, status=400) is Action.PAUSE_NUMBER
    # A recipient's or a template's problem pauses neither.
    assert classify(code=131026, status=400) is Action.DROP_RECIPIENT
    assert classify(code=132001, status=400) is Action.STOP_CAMPAIGN


@given(status=st.integers(min_value=400, max_value=599), body=error_bodies | json_values)
def test_any_error_answer_is_classified_and_never_raises(status, body):
    error = _error_from(status, body)
    assert error.code is None or isinstance(error.code, int)
    action = classify(code=error.code, status=status)
    assert isinstance(action, Action)
    # Only the codes Meta documents as the account's pause the whole organization.
    if action is Action.STOP_ORGANIZATION:
        assert error.code in ACCOUNT
    if action is Action.PAUSE_NUMBER:
        assert error.code in (0, 3, 10, 190, 33, 131037, 131045, 131048, 133010) or 200 <= error.code < 300
