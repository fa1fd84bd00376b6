"""The inbox: what an intake accepted, kept in PostgreSQL until a worker has applied it.

A webhook request does only what must happen before its answer: authenticate, check the shape,
`accept` (one INSERT, committed together with those of the process's other requests by its group
commit, `write`), answer. The domain work happens on workers: `drain`
takes the oldest pending events of a kind with `SELECT … FOR UPDATE SKIP LOCKED LIMIT n`, hands
them to the kind's registered handler (apps register, as with crm.recovery; the platform imports
no app) and deletes them in the same transaction as the handler's writes. So an event is applied
once and only once whoever dies when: a web process after the INSERT (the event waits), a worker
mid-batch (the transaction rolls back, the rows stay), Redis (the wake-up is lost, the rows stay
and the safety sweep in the recovery pass drains them within a minute or two).

Wake-up without a Redis round trip per request: `accept` only marks the kind as owed in the
process; a thread of the process sends at most one wake-up per kind every WAKE_INTERVAL (a SET of
the kind's "dirty" flag, and a drain job when none is queued). A drain job clears the flag before
each pass and, once the inbox is empty, gives its "queued" marker back and looks at the flag again,
so an event committed while it finished is never left waiting.

Drains of one kind are serialised by a PostgreSQL advisory lock, so an organization's events are
applied in the order they were accepted (preferences: the latest wins) and two batches never lock
the same rows. Organizations are served in turn: each batch holds the first waiting events of every
organization with events waiting (ORGS_PER_BATCH at most, rotating), so a burst of one never makes
another's events wait behind it.

An event its handler cannot apply yet (an ESP's bounce that came before our send job recorded the
message) stays in the inbox too, never in Redis: the handler returns it with what is left of its
payload (`Retry`), and the drain's transaction keeps that in the event's row instead of deleting it,
not to be drained before `not_before` (RETRY_DELAY, doubling up to RETRY_MAX_DELAY). A delayed drain
job is its wake-up; lost with Redis, the safety sweep drains it once due. After RETRY_ATTEMPTS
retries the event is set aside with the handler's reason, as one it refuses is."""

from __future__ import annotations

import functools
import logging
import re
import time
import zlib
from collections.abc import Iterator, Mapping
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models.functions import Coalesce
from django.utils import timezone

from crm import jobs, queues
from crm.inbox_intake import _TABLE, DRAIN_FUNC, PENDING, _transient, wake
from crm.inbox_kinds import _HANDLERS, Event, Handler, Retry
from crm.models import InboxEvent

logger = logging.getLogger(__name__)

BATCH = 500  # events per drain transaction (at most: fewer while a batch takes longer than BATCH_SECONDS)
MIN_BATCH = 50  # events per drain transaction at least, however slow
PAUSE = 0.05  # seconds a drain waits after a batch that was not full, gathering the next one
LINGER = 0.5  # seconds a drain job waits for more events before it ends
DRAIN_BUDGET = 50.0  # seconds a drain job keeps draining before handing over to a new job
SET_ASIDE_KEEP = timedelta(days=30)  # set-aside events are deleted this long after (the admin shows them)
SWEEP_AFTER = timedelta(seconds=20)  # events older (or due for so long) are the safety sweep's
RETRY_DELAY = 5.0  # seconds before an event its handler could not apply yet is given to it again
RETRY_MAX_DELAY = 600.0  # the delay doubles at each retry up to this
RETRY_ATTEMPTS = 12  # retries before such an event is set aside (5 s … 10 min: about an hour in all)


# --- the worker side --------------------------------------------------------------------------
# The due events of a kind, organizations in turn (issue 28: one tenant's webhook storm never
# delays another's statuses). The organizations with fresh events are found by a loose index scan
# of `inbox_fresh` (kind, organization, id: one probe per organization, never a pass over the
# backlog), at most ORGS_PER_BATCH of them from `after` on (rotating when more wait); each gives its
# oldest events, up to a share that fills the batch, ranked 1, 2, 3… in acceptance order; events
# without an organization are one more such tenant and those whose retry has come go first. The
# batch is the BATCH lowest ranks: every waiting organization has its first events in it, and a
# lone organization fills it. Then the rows are locked by primary key.
ORGS_PER_BATCH = 500  # organizations served per batch (more wait their turn in the next one)
SPREAD = 8  # an organization's share is SPREAD times the batch over the organizations waiting: fills it
_FRESH = "kind = %(kind)s AND failed_at IS NULL AND not_before IS NULL"
_SELECT = f"""
WITH RECURSIVE orgs(org, k) AS (
    (SELECT organization_id, 1 FROM {_TABLE} WHERE {_FRESH} AND organization_id > %(after)s
     ORDER BY organization_id LIMIT 1)
    UNION ALL
    SELECT (SELECT e.organization_id FROM {_TABLE} e WHERE e.{_FRESH} AND e.organization_id > o.org
            ORDER BY e.organization_id LIMIT 1), o.k + 1
    FROM orgs o WHERE o.org IS NOT NULL AND o.k < %(orgs)s
),
turns AS (SELECT org FROM orgs WHERE org IS NOT NULL),
share AS (
    SELECT least(%(limit)s, ceil(%(limit)s * {SPREAD}.0 / (count(*) + 1)))::int AS n FROM turns
),
ranked AS (
    SELECT l.id, l.r FROM turns, share, LATERAL (
        SELECT id, row_number() OVER (ORDER BY id) AS r FROM {_TABLE}
        WHERE {_FRESH} AND organization_id = turns.org ORDER BY id LIMIT share.n) l
    UNION ALL
    SELECT l.id, l.r FROM share, LATERAL (
        SELECT id, row_number() OVER (ORDER BY id) AS r FROM {_TABLE}
        WHERE {_FRESH} AND organization_id IS NULL ORDER BY id LIMIT share.n) l
    UNION ALL
    (SELECT id, 0 FROM {_TABLE} WHERE kind = %(kind)s AND failed_at IS NULL AND not_before <= now()
     ORDER BY not_before LIMIT %(limit)s)
)
SELECT id, kind, organization_id, received_at, payload, retries FROM {_TABLE}
WHERE id = ANY(ARRAY(SELECT id FROM ranked ORDER BY r, id LIMIT (
    SELECT CASE WHEN count(*) > 1 THEN %(shared)s ELSE %(limit)s END FROM turns)))
ORDER BY id FOR UPDATE SKIP LOCKED
"""  # noqa: S608 - the table's name and constants only
# Per kind: the organization after which the next batch starts looking when the last one met
# ORGS_PER_BATCH of them (-1: from the first). In-process: drains of a kind hold its lock in turn.
_after: dict[str, int] = {}
_tenants: dict[str, int] = {}  # per kind: the tenants (organizations, and "none") of its last batch
_RETRY = (
    f"UPDATE {_TABLE} AS e SET payload = r.payload, retries = e.retries + 1, "  # noqa: S608
    "not_before = now() + make_interval(secs => r.delay) "
    "FROM unnest(%s::bigint[], %s::text[], %s::float8[]) AS r(id, payload, delay) WHERE e.id = r.id"
)
_GIVE_UP = (
    f"UPDATE {_TABLE} AS e SET payload = r.payload, failed_at = now(), error = r.error "  # noqa: S608
    "FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS r(id, payload, error) WHERE e.id = r.id"
)


def _lock_id(kind: str) -> int:
    return zlib.crc32(f"crm.inbox:{kind}".encode())


def drain_batch(kind: str, *, limit: int = BATCH, shared_limit: int | None = None) -> int:
    """Apply up to `limit` due events of `kind` (`shared_limit` when several organizations have
    events waiting), organizations in turn and each one's in acceptance order, and delete them, in
    one transaction (keeping those to retry later); returns how many were taken (applied, kept or
    set aside)."""
    handler = _HANDLERS[kind]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_id(kind)])
            cursor.execute(
                _SELECT,
                {
                    "kind": kind,
                    "limit": limit,
                    "shared": min(limit, limit if shared_limit is None else shared_limit),
                    "orgs": ORGS_PER_BATCH,
                    "after": _after.get(kind, -1),
                },
            )
            events = [Event(*row) for row in cursor.fetchall()]
        if not events:
            _after.pop(kind, None)
            _tenants.pop(kind, None)
            return 0
        _rotate(kind, events)
        try:
            with transaction.atomic():
                later = dict(handler(events) or {})
        except DatabaseError as exc:
            if _transient(exc):
                raise
            later = _one_by_one(handler, events)
        except Exception:
            later = _one_by_one(handler, events)
        done = [e.id for e in events if e.id not in later]
        InboxEvent.objects.filter(id__in=done, failed_at__isnull=True).delete()
        _retry_later(kind, [e for e in events if e.id in later], later)
    return len(events)


def _rotate(kind: str, events: list[Event]) -> None:
    """Where the next batch of `kind` starts looking for organizations: after the last one served
    when this batch met ORGS_PER_BATCH of them (the others' turn), else from the first."""
    _tenants[kind] = len({e.organization_id for e in events})
    served = {e.organization_id for e in events if e.organization_id is not None}
    if len(served) >= ORGS_PER_BATCH:
        _after[kind] = max(served)
    else:
        _after.pop(kind, None)


def retry_delay(retries: int) -> float:
    """Seconds before an event is given to its handler again after its `retries`-th Retry."""
    return min(RETRY_DELAY * 2 ** (retries - 1), RETRY_MAX_DELAY)


def _retry_later(kind: str, events: list[Event], later: Mapping[int, Retry]) -> None:
    """Keep what the handler could not apply yet, due after the next delay, and wake a drain then;
    set aside what has had its RETRY_ATTEMPTS retries."""
    again = [e for e in events if e.retries < RETRY_ATTEMPTS]
    spent = [e for e in events if e.retries >= RETRY_ATTEMPTS]
    with connection.cursor() as cursor:
        if again:
            delays = [retry_delay(e.retries + 1) for e in again]
            cursor.execute(_RETRY, [[e.id for e in again], [later[e.id].payload for e in again], delays])
            for delay in sorted(set(delays)):
                transaction.on_commit(functools.partial(_wake_in, kind, delay))
        if spent:
            errors = [f"given up after {e.retries} retries: {later[e.id].reason}"[:2000] for e in spent]
            for event, error in zip(spent, errors, strict=True):
                logger.error("inbox: %s event %s set aside: %s", kind, event.id, error)
            cursor.execute(_GIVE_UP, [[e.id for e in spent], [later[e.id].payload for e in spent], errors])


def _wake_in(kind: str, delay: float) -> None:
    """A drain of `kind` in `delay` seconds, for the events kept until then (one job per kind and
    second). Without Redis the safety sweep drains them once due."""
    due = int(time.time() + delay) + 1
    try:
        jobs.enqueue(
            DRAIN_FUNC,
            queue=queues.INBOX,
            kwargs={"kind": kind},
            job_id=f"inbox-retry-{_job_safe(kind)}-{due}",
            delay=due - time.time(),
            result_ttl=0,
            after_commit=False,
        )
    except Exception:
        logger.warning("inbox: could not schedule the %s drain of events kept for later", kind, exc_info=True)


def _one_by_one(handler: Handler, events: list[Event]) -> dict[int, Retry]:
    """The batch failed: apply its events one at a time, setting aside the ones that fail alone;
    returns the Retry of those their handler could not apply yet."""
    later: dict[int, Retry] = {}
    for event in events:
        try:
            with transaction.atomic():
                later.update(handler([event]) or {})
        except Exception as exc:
            if _transient(exc):
                raise
            logger.exception("inbox: %s event %s set aside", event.kind, event.id)
            InboxEvent.objects.filter(pk=event.id).update(
                failed_at=timezone.now(), error=f"{type(exc).__name__}: {exc}"[:2000]
            )
    return later


def shared_limit(previous: int, taken: int, seconds: float) -> int:
    """The size of the next batch shared by several organizations, after a batch that applied
    `taken` events in `seconds`: an organization's event accepted while a batch is applied waits
    for the rest of it and then for the next one (its turn), and under load a batch of BATCH takes
    longer (CPU: the handlers' work), so a shared batch holds what the drain applies in
    INBOX_BATCH_SECONDS at its rate (between MIN_BATCH and BATCH; 0 in the setting: BATCH). An
    organization alone keeps batches of BATCH: its throughput."""
    target = float(settings.INBOX_BATCH_SECONDS)
    if target <= 0:
        return BATCH
    if taken < MIN_BATCH or seconds <= 0:
        return previous  # too few to measure a rate by
    if taken * target >= BATCH * seconds:  # fast enough for a whole batch (and no float overflow)
        return BATCH
    return max(MIN_BATCH, int(taken * target / seconds))


def drain(*, kind: str, budget: float = DRAIN_BUDGET) -> int:
    """The drain job: apply `kind`'s pending events batch after batch until none has come for
    LINGER (or the time budget is spent: a new job takes over); returns how many were taken. Safe
    to run twice, concurrently too.

    Under a burst a batch that was not full is followed by a pause of PAUSE, so the next one
    gathers what arrived meanwhile: fewer, larger transactions, and no job per handful of events."""
    deadline = time.monotonic() + budget
    total = 0
    shared = BATCH
    while True:
        PENDING.begin(kind)
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            started = time.monotonic()
            taken = drain_batch(kind, shared_limit=shared)
            total += taken
            if taken:
                idle_since = time.monotonic()
                PENDING.keep(kind)
            elif time.monotonic() - idle_since >= LINGER:
                break
            if taken < (shared if _tenants.get(kind, 0) > 1 else BATCH):
                time.sleep(PAUSE)
            shared = shared_limit(shared, taken, idle_since - started if taken else 0.0)
        if time.monotonic() >= deadline:
            PENDING.release(kind)
            wake(kind)
            return total
        # Give the marker back, then look again: an event accepted meanwhile either finds no
        # marker (and enqueues a new job) or set the flag before this check.
        if not PENDING.finish(kind):
            return total


def pending(kind: str | None = None) -> int:
    """Events accepted and not applied yet, those kept for a retry included (set-aside ones
    excluded)."""
    events = InboxEvent.objects.filter(failed_at__isnull=True)
    return (events.filter(kind=kind) if kind else events).count()


def set_aside_prune(*, limit: int = 10_000) -> int:
    """Delete up to `limit` events set aside more than SET_ASIDE_KEEP ago (poison events, and ESP
    events whose message never appeared: another system's, on a shared account); returns how many.
    An operator has had a month to look at them in the admin."""
    old = timezone.now() - SET_ASIDE_KEEP
    ids = (
        InboxEvent.objects.filter(failed_at__lt=old)
        .order_by("failed_at")
        .values_list("id", flat=True)[:limit]
    )
    deleted, _ = InboxEvent.objects.filter(id__in=list(ids)).delete()
    return deleted


def stranded() -> Iterator[jobs.JobSpec]:
    """The safety sweep: a drain for every kind with events accepted, or due for a retry, more than
    SWEEP_AFTER ago (their wake-up was lost with Redis or with the web process that owed it);
    events kept for a retry that is not due are left alone."""
    old = timezone.now() - SWEEP_AFTER
    kinds = (
        InboxEvent.objects.filter(failed_at__isnull=True)
        .alias(due=Coalesce("not_before", "received_at"))
        .filter(due__lt=old)
        .values_list("kind", flat=True)
        .distinct()
    )
    for kind in kinds:
        if kind in _HANDLERS:
            yield jobs.JobSpec(
                func=DRAIN_FUNC,
                queue=queues.INBOX,
                kwargs={"kind": kind},
                job_id=f"inbox-sweep-{_job_safe(kind)}",
            )


def _job_safe(kind: str) -> str:
    """The kind in a job id, which RQ allows only letters, digits, "_" and "-" ("runner.webhook")."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", kind)
