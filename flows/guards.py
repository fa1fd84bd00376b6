"""What a flow checks before a send besides what the campaigns' pipeline checks at send time
(consent, opt-outs, the contact caps): quiet hours, and the organization's global holdout."""

from __future__ import annotations

from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from crm import holdout


def global_holdout(*, enrollment: Any) -> str:
    """Why the enrollment's customer is held out of every send (the organization's global holdout,
    crm.holdout), or "": a transactional flow is exempt."""
    flow = enrollment.flow
    organization = flow.organization
    if flow.transactional or not organization.holdout_percent:
        return ""
    held = holdout.in_holdout(organization=organization, customer_ids=[enrollment.customer_id])
    return "global holdout" if held else ""


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
