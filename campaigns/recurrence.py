"""A recurring campaign's schedule in words a manager reads: what is refused and why (with examples
that work), and its next occurrences in the organization's time zone."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from croniter import croniter
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

# Cron expressions a manager can copy, with what they mean.
EXAMPLES = (
    ("0 9 * * 1", gettext_lazy("Mondays at 09:00")),
    ("30 18 * * 1-5", gettext_lazy("weekdays at 18:30")),
    ("0 10 1 * *", gettext_lazy("the 1st of every month at 10:00")),
)


def examples() -> str:
    return "; ".join(f"'{cron}' = {meaning}" for cron, meaning in EXAMPLES)


def recurrence_error(text: str) -> str:
    """Why `text` cannot be a campaign's recurrence, with examples of what works; "" when it can."""
    if croniter.is_valid(text.strip()) and len(text.strip().split()) == 5:
        return ""
    return _(
        "%(value)r cannot be read as a schedule. Write it as cron (minute hour day month weekday), "
        "in the organization's time zone: %(examples)s."
    ) % {"value": text, "examples": examples()}


def next_occurrences(
    expression: str, zone: str, *, count: int = 3, after: datetime | None = None
) -> list[datetime]:
    """The next `count` occurrences of a valid cron expression, aware, in `zone`."""
    it = croniter(expression, (after or timezone.now()).astimezone(ZoneInfo(zone)))
    return [it.get_next(datetime) for _ in range(count)]
