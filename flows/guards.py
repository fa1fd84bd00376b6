"""What a flow checks before a send besides what the campaigns' pipeline checks at send time
(consent, opt-outs, the contact caps): quiet hours, and the organization's global holdout."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

# The global holdout (customers kept out of all marketing to measure lift): crm/holdout.py when it
# exists provides `holdout_reason(*, organization_id, customer_id) -> str` ("" when not held out).
_HOLDOUT: Callable[..., str] | None = None
if importlib.util.find_spec("crm.holdout") is not None:  # pragma: no cover - lands with the lift work
    _HOLDOUT = getattr(importlib.import_module("crm.holdout"), "holdout_reason", None)


def global_holdout(*, enrollment: Any) -> str:
    """Why the enrollment's customer is held out of every send (global holdout), or ""."""
    if _HOLDOUT is None:
        return ""
    return _HOLDOUT(organization_id=enrollment.organization_id, customer_id=enrollment.customer_id) or ""


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
