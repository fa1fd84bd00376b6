"""items_classify, the pure step of an ItemJob: outcomes in, the plan of writes out, no database."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from integrations.runner.contract import ItemIn, ItemOutcome
from runner.plan import ERROR_MAX, items_classify


def _item(item_id: int, attempt: int = 1) -> ItemIn:
    return ItemIn(item_id=item_id, execution_id=1, external_id=str(item_id), payload={}, attempt=attempt)


def test_it_splits_plain_successes_from_those_with_a_result():
    plan = items_classify(
        items=[_item(1), _item(2)],
        outcomes=[ItemOutcome(1, True), ItemOutcome(2, True, result={"id": "x"})],
        max_attempts=3,
    )
    assert plan.succeeded == [1]
    assert plan.succeeded_with_result == [(2, {"id": "x"})]
    assert plan.dlq == {} and plan.retry == {} and plan.released == []
    assert plan.retry_attempt == 0
    assert plan.breaker_outcome == "success"


def test_a_retryable_failure_retries_until_the_last_attempt_then_goes_to_the_dlq():
    outcomes = [ItemOutcome(1, False, True, "timeout"), ItemOutcome(2, False, True, "timeout")]
    plan = items_classify(items=[_item(1, attempt=2), _item(2, attempt=3)], outcomes=outcomes, max_attempts=3)
    assert plan.retry == {"timeout": [1]}
    assert plan.dlq == {"timeout": [2]}
    assert plan.retry_attempt == 2
    assert plan.succeeded == []


def test_a_permanent_failure_goes_to_the_dlq_at_once_grouped_by_error():
    outcomes = [
        ItemOutcome(1, False, False, "bad payload"),
        ItemOutcome(2, False, False, "bad payload"),
        ItemOutcome(3, False, False, ""),
    ]
    plan = items_classify(items=[_item(1), _item(2), _item(3)], outcomes=outcomes, max_attempts=3)
    assert plan.dlq == {"bad payload": [1, 2], "error": [3]}
    assert plan.retry == {} and plan.retry_attempt == 0


def test_the_items_not_called_after_an_outage_are_released_and_the_breaker_sees_a_failure():
    items = [_item(1), _item(2), _item(3)]
    outcomes = [ItemOutcome(1, True), ItemOutcome(2, False, True, "503", systemic=True)]
    plan = items_classify(items=items, outcomes=outcomes, max_attempts=3)
    assert plan.released == [3]
    assert plan.succeeded == [1]
    assert plan.retry == {"503": [2]}
    assert plan.breaker_outcome == "failure"


def test_the_backoff_counts_from_the_lowest_attempt_among_the_retried():
    items = [_item(1, attempt=2), _item(2, attempt=1)]
    outcomes = [ItemOutcome(1, False, True, "x"), ItemOutcome(2, False, True, "y")]
    assert items_classify(items=items, outcomes=outcomes, max_attempts=3).retry_attempt == 1


def test_a_long_error_is_cut():
    plan = items_classify(
        items=[_item(1)], outcomes=[ItemOutcome(1, False, False, "e" * (ERROR_MAX + 5))], max_attempts=3
    )
    assert [len(error) for error in plan.dlq] == [ERROR_MAX]


_outcome = st.tuples(st.booleans(), st.booleans(), st.booleans(), st.text(max_size=5), st.integers(1, 4))


@given(st.lists(_outcome, max_size=20), st.integers(0, 5))
def test_every_item_lands_in_exactly_one_place(rows, not_called):
    """Handler answers are outside input: whatever they are, each claimed item gets one fate."""
    items = [_item(i, attempt=row[4]) for i, row in enumerate(rows)]
    items += [_item(len(rows) + k) for k in range(not_called)]
    outcomes = [
        ItemOutcome(i, ok, retryable, error, result=None, systemic=systemic)
        for i, (ok, retryable, systemic, error, _) in enumerate(rows)
    ]
    plan = items_classify(items=items, outcomes=outcomes, max_attempts=3)
    placed = (
        plan.succeeded
        + [i for i, _ in plan.succeeded_with_result]
        + [i for ids in plan.dlq.values() for i in ids]
        + [i for ids in plan.retry.values() for i in ids]
        + plan.released
    )
    assert sorted(placed) == [i.item_id for i in items]
    assert all(items[i].attempt < 3 for ids in plan.retry.values() for i in ids)
    assert plan.breaker_outcome == ("failure" if any(o.systemic for o in outcomes) else "success")
