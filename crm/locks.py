"""Distributed locks in Redis: SET NX EX with an owner token, released only by their owner."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import LockError
from redis.lock import Lock

from crm.jobs import get_connection

PREFIX = "crm:lock:"


def lock_acquire(name: str, *, ttl: int = 300) -> Lock | None:
    """Take the lock `name` for `ttl` seconds without waiting; None if someone else holds it.

    redis-py's Lock does exactly the seed's `SET key token NX EX ttl` and releases with a
    compare-and-delete script, so an expired owner can never release a newer owner's lock.
    """
    lock = Lock(get_connection(), PREFIX + name, timeout=ttl, blocking=False)
    return lock if lock.acquire() else None


def lock_release(lock: Lock) -> bool:
    """Release if still owned; False when the lock had expired or passed to another owner."""
    try:
        lock.release()
    except LockError:
        return False
    return True


@contextmanager
def locked(name: str, *, ttl: int = 300) -> Iterator[bool]:
    """`with locked("campaign:42") as got:` — `got` is False when another holder has it."""
    lock = lock_acquire(name, ttl=ttl)
    try:
        yield lock is not None
    finally:
        if lock is not None:
            lock_release(lock)
