"""The inbox's kinds: each app registers the handler that applies its events (`register`, from
its AppConfig.ready), as with crm.recovery; the platform imports no app."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Event:
    id: int
    kind: str
    organization_id: int | None
    received_at: datetime
    payload: str
    retries: int = 0  # times its handler has already been given it and returned a Retry


@dataclass(frozen=True)
class Retry:
    """What a handler returns for an event it could not apply (wholly) yet: the payload still to
    apply, given to it again later, and why not now (the error kept if it never can be)."""

    payload: str
    reason: str


Handler = Callable[[list[Event]], Mapping[int, Retry] | None]
_HANDLERS: dict[str, Handler] = {}


def register(kind: str) -> Callable[[Handler], Handler]:
    """Decorator: `@inbox_kinds.register("whatsapp")` on a function applying a batch of that kind's events
    (in acceptance order) inside the drain's transaction. It must be safe to run twice on the same
    events and raise on failure (the batch is rolled back and retried; an event that fails on its
    own is set aside with the error). It returns None, or a Retry by event id for the events it
    could not apply yet (kept and given to it again later, in the same transaction)."""

    def deco(fn: Handler) -> Handler:
        _HANDLERS[kind] = fn
        return fn

    return deco


def kinds() -> list[str]:
    return sorted(_HANDLERS)
