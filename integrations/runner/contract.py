"""The values that flow between the runner and a handler, in-process or over HTTP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunIn:
    """What a handler's produce(run) is given."""

    execution_id: int
    organization_id: int
    integration_key: str
    handler_key: str
    direction: str
    trigger: str


@dataclass(frozen=True)
class ItemIn:
    """What a handler's process(item) / process_batch(items) is given."""

    item_id: int
    execution_id: int
    external_id: str
    payload: Any
    attempt: int
    direction: str = ""
    integration_key: str = ""
    handler_key: str = ""
    organization_id: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "execution_id": self.execution_id,
            "external_id": self.external_id,
            "payload": self.payload,
            "attempt": self.attempt,
            "direction": self.direction,
            "integration_key": self.integration_key,
            "handler_key": self.handler_key,
            "organization_id": self.organization_id,
        }


@dataclass
class ItemOutcome:
    item_id: int
    ok: bool
    retryable: bool = False
    error: str = ""
    result: Any = None
    # The call failed as a whole (unreachable, 5xx, timeout): counts against the circuit breaker.
    systemic: bool = False


@dataclass
class ProducedPage:
    items: list[dict[str, Any]] = field(default_factory=list)
    next_cursor: Any = None
