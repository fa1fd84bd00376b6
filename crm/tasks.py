"""RQ job functions of the platform itself. Jobs take ids and plain values and load fresh state."""

from __future__ import annotations

from crm import cron, inbox, recovery


def recover_pass() -> dict[str, int]:
    """The periodic recovery pass; returns how many jobs each recoverer re-enqueued."""
    return recovery.recover()


def cron_fire(name: str) -> str | None:
    """Fired by rq-scheduler for a cron entry: enqueue the entry's job for this occurrence."""
    return cron.cron_fire(name)


def noop() -> None:
    """Does nothing; used by the worker benchmark and smoke tests."""


def inbox_set_aside_prune() -> int:
    """Cron (daily): delete the inbox events set aside more than a month ago, 10,000 at a time."""
    total = 0
    while pruned := inbox.set_aside_prune():
        total += pruned
    return total
