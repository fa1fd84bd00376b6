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


# Cron's weekdays (0 and 7 are Sunday), each as the phrase that agrees with it in the language.
_EVERY_WEEKDAY = (
    gettext_lazy("every Sunday"),
    gettext_lazy("every Monday"),
    gettext_lazy("every Tuesday"),
    gettext_lazy("every Wednesday"),
    gettext_lazy("every Thursday"),
    gettext_lazy("every Friday"),
    gettext_lazy("every Saturday"),
)


def _numbers(field: str, low: int, high: int) -> list[int] | None:
    """A cron field of plain numbers and ranges ("1", "1,4", "1-5") as its values; None otherwise."""
    values: list[int] = []
    for part in field.split(","):
        first, _sep, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return None
        start, end = int(first), int(last or first)
        if not low <= start <= end <= high:
            return None
        values.extend(range(start, end + 1))
    return sorted(set(values))


def _and(items: list[str]) -> str:
    return (
        items[0]
        if len(items) == 1
        else _("%(items)s and %(last)s")
        % {
            "items": ", ".join(items[:-1]),
            "last": items[-1],
        }
    )


def describe(expression: str) -> str:
    """A valid cron expression in words, in the active language ("toda segunda-feira às 09:00" in
    pt-BR), for the common shapes a manager writes: given hours and minutes on every day, given
    weekdays or given days of the month. "" for any other shape (the page shows the next runs)."""
    parts = expression.split()
    if len(parts) != 5 or recurrence_error(expression):
        return ""
    minute, hour, day, month, weekday = parts
    minutes, hours = _numbers(minute, 0, 59), _numbers(hour, 0, 23)
    if minutes is None or hours is None or len(minutes) * len(hours) > 6 or month != "*":
        return ""
    at = _("at %(times)s") % {"times": _and([f"{h:02d}:{m:02d}" for h in hours for m in minutes])}
    if day == "*" and weekday == "*":
        return _("every day %(at)s") % {"at": at}
    if day == "*":
        weekdays = _numbers(weekday, 0, 7)
        if weekdays is None:
            return ""
        days = sorted({w % 7 for w in weekdays})
        if days == [1, 2, 3, 4, 5]:
            return _("Monday to Friday %(at)s") % {"at": at}
        return f"{_and([str(_EVERY_WEEKDAY[w]) for w in days])} {at}"
    if weekday == "*":
        days_of_month = _numbers(day, 1, 31)
        if days_of_month is None:
            return ""
        return _("on day %(days)s of every month %(at)s") % {
            "days": _and([str(d) for d in days_of_month]),
            "at": at,
        }
    return ""
