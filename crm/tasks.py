"""RQ job functions of the platform itself. Jobs take ids and plain values and load fresh state."""

from __future__ import annotations

from crm import cron, recovery


def recover_pass() -> dict[str, int]:
    """The periodic recovery pass; returns how many jobs each recoverer re-enqueued."""
    return recovery.recover()


def cron_fire(name: str) -> str | None:
    """Fired by rq-scheduler for a cron entry: enqueue the entry's job for this occurrence."""
    return cron.cron_fire(name)


def noop() -> None:
    """Does nothing; used by the worker benchmark and smoke tests."""
