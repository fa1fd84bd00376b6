"""What a flow checks before a send besides what the campaigns' pipeline checks at send time
(consent, opt-outs, the contact caps): quiet hours, and the organization's global holdout."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from crm import holdout


def global_holdout(*, enrollment: Any, held: set[int] | None = None) -> str:
    """Why the enrollment's customer is held out of every send (the organization's global holdout,
    crm.holdout), or "": a transactional flow is exempt. `held`: `held_out` of its batch, read
    once for all of them."""
    flow = enrollment.flow
    organization = flow.organization
    if flow.transactional or not organization.holdout_percent:
        return ""
    if held is None:
        held = holdout.in_holdout(organization=organization, customer_ids=[enrollment.customer_id])
    return "global holdout" if enrollment.customer_id in held else ""


def held_out(*, enrollments: Iterable[Any]) -> set[int]:
    """The customers of these enrollments in their organization's global holdout: one statement
    per organization with a holdout (a batch's check, instead of one per send)."""
    by_org: dict[int, tuple[Any, set[int]]] = {}
    for e in enrollments:
        organization = e.flow.organization
        if not e.flow.transactional and organization.holdout_percent:
            by_org.setdefault(organization.pk, (organization, set()))[1].add(e.customer_id)
    held: set[int] = set()
    for organization, customer_ids in by_org.values():
        held |= holdout.in_holdout(organization=organization, customer_ids=customer_ids)
    return held


def _parse(spec: str) -> tuple[time, time] | None:
    if not spec.strip():
        return None
    start, end = (time.fromisoformat(part.strip()) for part in spec.split("-", 1))
    return start, end


def quiet_until(*, now: datetime, tz: ZoneInfo, spec: str) -> datetime | None:
    """The end of the quiet hours `spec` ("22:00-08:00", local) when `now` falls inside them, else None."""
    window = _parse(spec)
    if window is None:
        return None
    start, end = window
    local = now.astimezone(tz)
    t = local.time()
    inside = (start <= t < end) if start <= end else (t >= start or t < end)
    if not inside:
        return None
    day = local.date() if t < end else local.date() + timedelta(days=1)
    return datetime.combine(day, end, tzinfo=tz)
