"""A flow's JSON: validated strictly, extra keys refused with the path, round-trips."""

from __future__ import annotations

import contextlib
import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows import schema
from tests.flows.conftest import THANKS


def test_the_issue_example_parses_and_keeps_its_values():
    clean = schema.flow_parse(THANKS)
    assert clean["trigger"] == {"type": "sale", "min_total": "100.00"}
    assert clean["steps"][1]["variables"] == ["first_name"]
    assert schema.flow_parse(clean) == clean


@pytest.mark.parametrize(
    ("path", "change", "message"),
    [
        ((), {"colour": "red"}, "flow: unknown key(s) 'colour'"),
        (("trigger",), {"minimum": 1}, "trigger: unknown key(s) 'minimum'"),
        (("steps", 0), {"seconds": 3}, "steps[0]: unknown key(s) 'seconds'"),
        (("steps", 1), {"template": ""}, "steps[1].template: expected a non-empty string"),
        (("steps", 0), {"minutes": -1}, "steps[0].minutes: expected an integer"),
        (("trigger",), {"type": "birthday"}, "trigger.type: expected one of"),
    ],
)
def test_it_refuses_a_bad_definition_naming_the_path(path, change, message):
    data = copy.deepcopy(THANKS)
    target = data
    for part in path:
        target = target[part]
    target.update(change)
    with pytest.raises(schema.FlowSchemaError) as raised:
        schema.flow_parse(data)
    assert message in str(raised.value)


def test_split_percentages_must_add_up_and_branches_must_exist():
    steps = [
        {
            "type": "split",
            "branches": [{"name": "a", "percent": 50}, {"name": "h", "percent": 40, "holdout": True}],
        }
    ]
    with pytest.raises(schema.FlowSchemaError, match="add up to 100"):
        schema.flow_parse({**THANKS, "steps": steps})
    steps = [{"type": "send_whatsapp", "template": "t", "branch": "b"}]
    with pytest.raises(schema.FlowSchemaError, match=r"steps\[0\].branch"):
        schema.flow_parse({**THANKS, "steps": steps})


@settings(max_examples=60, deadline=None)
@given(
    key=st.text(min_size=1, max_size=12).filter(lambda k: k not in schema._TOP_KEYS),
    value=st.integers() | st.text(),
)
def test_any_extra_top_level_key_is_refused(key, value):
    with pytest.raises(schema.FlowSchemaError, match="unknown key"):
        schema.flow_parse({**THANKS, key: value})


@settings(max_examples=60, deadline=None)
@given(
    data=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=10,
    )
)
def test_arbitrary_json_is_refused_or_parsed_never_crashes(data):
    with contextlib.suppress(schema.FlowSchemaError):
        schema.flow_parse(data)
