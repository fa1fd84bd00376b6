"""RQ job functions of the flows app: take ids, load fresh state, call the engine."""

from __future__ import annotations

from django.utils import timezone

from crm import recovery
from flows import engine, triggers


def enrollments_advance(*, enrollment_ids: list[int]) -> dict[str, str]:
    """Run a batch of enrollments' due steps (flows.engine). Safe to run twice."""
    states = engine.enrollments_advance(enrollment_ids=enrollment_ids)
    return {str(k): v for k, v in states.items()}


def enrollment_advance(*, enrollment_id: int) -> str:
    """One enrollment's due steps: a job enqueued before the batches (still on a queue)."""
    return engine.enrollment_advance(enrollment_id=enrollment_id)


def flows_tick() -> dict[str, int]:
    """The periodic pass: today's date/no-purchase entries (once per local day), then a job for
    every due step whose job Redis does not hold. Costs what is due, never what is enrolled."""
    now = timezone.now()
    entered = triggers.daily_passes(now=now)
    enqueued = recovery.requeue_missing(triggers.due_specs(now=now))
    return {"entered": entered, "enqueued": enqueued}
