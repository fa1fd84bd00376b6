"""What an ItemJob's outcomes mean for its items: a pure classification, no database.

`items_classify` turns the handler's answers into an `ItemsPlan` (which items succeed, which go
back to pending for a retry and after what backoff, which go to the DLQ, which were never called);
`runner.items.items_apply` writes that plan in one transaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from integrations.runner.contract import ItemIn, ItemOutcome

# Stored errors are cut to this many characters (the column is text; a handler may echo a page).
ERROR_MAX = 10_000


@dataclass(frozen=True)
class ItemsPlan:
    """The writes one ItemJob's outcomes call for, grouped so each group is one UPDATE."""

    succeeded: list[int] = field(default_factory=list)
    """Succeeded without a result to store."""
    succeeded_with_result: list[tuple[int, Any]] = field(default_factory=list)
    dlq: dict[str, list[int]] = field(default_factory=dict)
    """Failed for good (not retryable, or out of attempts), by error: FAILED and into the DLQ."""
    retry: dict[str, list[int]] = field(default_factory=dict)
    """Back to pending, by error, for another attempt."""
    released: list[int] = field(default_factory=list)
    """Claimed but not called (the group stopped at an outage): back to pending, attempt given back."""
    retry_attempt: int = 0
    """The lowest attempt among the retried items, the one the job's backoff counts from (0: none)."""
    systemic: bool = False
    """Some call failed as an outage: the breaker is told of a failure."""

    @property
    def breaker_outcome(self) -> str:
        return "failure" if self.systemic else "success"


def items_classify(*, items: list[ItemIn], outcomes: list[ItemOutcome], max_attempts: int) -> ItemsPlan:
    """The plan for `outcomes`, the answers for the first len(outcomes) of `items` (the rest were
    not called). An item fails for good when its error is not retryable or its attempt (the claim's,
    first run included) has reached `max_attempts`."""
    attempts = {i.item_id: i.attempt for i in items}
    ok = [o for o in outcomes if o.ok]
    final = [o for o in outcomes if not o.ok and (not o.retryable or attempts[o.item_id] >= max_attempts)]
    retry = [o for o in outcomes if not o.ok and o.retryable and attempts[o.item_id] < max_attempts]
    return ItemsPlan(
        succeeded=[o.item_id for o in ok if o.result is None],
        succeeded_with_result=[(o.item_id, o.result) for o in ok if o.result is not None],
        dlq=_by_error(final),
        retry=_by_error(retry),
        released=[i.item_id for i in items[len(outcomes) :]],
        retry_attempt=min((attempts[o.item_id] for o in retry), default=0),
        systemic=any(o.systemic for o in outcomes),
    )


def _by_error(outcomes: Iterable[ItemOutcome]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for o in outcomes:
        groups[o.error[:ERROR_MAX] or "error"].append(o.item_id)
    return dict(groups)
