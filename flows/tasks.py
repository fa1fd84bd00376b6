"""RQ job functions of the flows app: take ids, load fresh state, call the engine."""

from __future__ import annotations

from django.utils import timezone

from crm import recovery
from flows import engine, triggers


def enrollment_advance(*, enrollment_id: int) -> str:
    """Run one enrollment's due steps (flows.engine). Safe to run twice."""
    return engine.enrollment_advance(enrollment_id=enrollment_id)


def flows_tick() -> dict[str, int]:
    """The periodic pass: today's date/no-purchase entries (once per local day), then a job for
    every due step whose job Redis does not hold. Costs what is due, never what is enrolled."""
    now = timezone.now()
    entered = triggers.daily_passes(now=now)
    enqueued = recovery.requeue_missing(triggers.due_specs(now=now))
    return {"entered": entered, "enqueued": enqueued}
