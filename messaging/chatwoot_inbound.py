"""What customers write, delivered to the organization's Chatwoot: each inbound message as an
incoming message of the contact's conversation (the store's inbox where one is set), each reply
sent from here and each campaign message sent (its copy, source "campaign") as an outgoing one,
and a flow's handoff as a private note that opens (and assigns) the conversation, in order per
conversation.

A message waits in the database (`ConversationMessage.chatwoot_pending`) until Chatwoot took it, so
nothing depends on Redis or on Chatwoot being up: a push job per organization delivers what waits,
oldest first, one queued or running per organization however many messages are written meanwhile
(`PENDING`: the push passes again while messages came during its pass). One holds the
organization's advisory lock; a second one (`recover`'s) leaves what waits to it. Chatwoot down:
the job defers without spending an attempt, still the organization's one push, and delivers in
order when it is back. Token refused: the messages wait with the error (the
admin's "waiting for Chatwoot"); saving the organization's Chatwoot account pushes again at once,
and the recovery pass every minute, so what was refused meanwhile is delivered once the token is
fixed. The contact and conversation ids found for a customer are kept (`ChatwootThread`): a
customer's later messages cost one call each, a new contact two (the contact, then its conversation
created with the message).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from redis import Redis

from crm import jobs, queues, recovery
from integrations.chatwoot.client import ChatwootClient
from integrations.errors import IntegrationError
from integrations.models import ChatwootAccount
from messaging.chatwoot_delivery import MAYBE_DELIVERED, Thread, deliver
from messaging.models import ChatwootThread, ConversationMessage


def _concurrency() -> int:
    """Conversations delivered side by side (each in order): Chatwoot's latency is paid per message."""
    return max(int(settings.CHATWOOT_PUSH_CONCURRENCY), 1)


logger = logging.getLogger(__name__)

PUSH_TASK = "messaging.tasks.chatwoot_push"
# A conversation row that is a handoff to a person (conversations.handoff_queue): delivered as a
# private note, and its conversation opened and assigned.
PUSH_CHUNK = 500
STREAM_POLL = 0.05  # seconds between reads of newly committed rows while conversations are in flight
WRITE_EVERY = 0.25  # seconds between writes of the rows delivered while conversations are in flight
DOWN_DEFER = 10.0  # seconds before trying a Chatwoot that did not answer again
_ACCOUNT_LEVEL_STATUSES = (401, 403)
# The error's prefix of a row whose post went out without an answer: looked for before posting again.
TAKEN = MAYBE_DELIVERED + "taken by a push that did not finish"
_LOCK_SPACE = 0x43570000  # advisory lock ids: this space + the organization's id


# One push per organization queued or running, however many messages are written meanwhile
# (crm.jobs.Pending): a push clears the flag before it reads what waits, and passes again while
# messages were written during its pass. A running push keeps its marker alive (every third of
# MARKER_TTL, as the inbox's drain does), so the marker of a push killed with its worker (kill -9,
# OOM) frees itself within MARKER_TTL: the next message written enqueues a push at once; the dead
# push's retry (the registry sweep) or `recover` (what waits over 30 s) takes over sooner or what
# was written before. A push waiting deferred (Chatwoot down) or for a fixed token keeps its marker
# for the queue's timeout, so writers meanwhile enqueue nothing that would only wait or be refused.
MARKER_TTL = 30
WAITING_TTL = queues.get_spec(queues.CHATWOOT_INBOUND).timeout + 60
PENDING = jobs.Pending("chatwoot-push", MARKER_TTL)


def push_job_id(organization_id: int) -> str:
    return f"chatwoot-push-{organization_id}"


def _enqueue(organization_id: int) -> None:
    jobs.enqueue(
        PUSH_TASK,
        queue=queues.CHATWOOT_INBOUND,
        kwargs={"organization_id": organization_id},
        organization_id=organization_id,
        result_ttl=60,
        after_commit=False,
    )


def _wake(organization_id: int) -> None:
    PENDING.wake(organization_id, functools.partial(_enqueue, organization_id))


def push_enqueue(*, organization_id: int) -> None:
    """After the commit, a push of the organization's waiting messages on its fair queue, unless
    one is queued or running (it takes them). Redis failing here fails nothing: `recover` pushes."""
    transaction.on_commit(functools.partial(_wake, organization_id), robust=True)


def account_saved(sender: type, instance: ChatwootAccount, **kwargs: object) -> None:
    """post_save of a ChatwootAccount: a fixed token or address delivers what waits at once (after
    commit; Redis failing here never fails the save, the recovery pass pushes within a minute)."""
    organization_id = instance.organization_id
    if instance.enabled and waiting(organization_id):
        # A push at once even when one waits deferred (a Chatwoot that was down or misaddressed).
        transaction.on_commit(functools.partial(_enqueue, organization_id), robust=True)


def waiting(organization_id: int | None = None, *, campaign: bool | None = None) -> dict[int, int]:
    """organization id -> how many messages wait for Chatwoot (the counter the admin shows); with
    `campaign`, only the campaign messages' copies (True) or only the others (False)."""
    rows = ConversationMessage.objects.filter(chatwoot_pending=True)
    if organization_id is not None:
        rows = rows.filter(organization_id=organization_id)
    if campaign is not None:
        by_campaign = Q(source=ConversationMessage.Source.CAMPAIGN)
        rows = rows.filter(by_campaign if campaign else ~by_campaign)
    return dict(
        rows.values_list("organization_id").annotate(n=Count("id")).values_list("organization_id", "n")
    )


def collect_waiting(connection: Redis) -> Iterator[Metric]:
    """`crm_chatwoot_waiting`: messages waiting for Chatwoot, and `crm_chatwoot_mirror_waiting`: the
    campaign messages among them (counts over the partial index of what waits)."""
    pending = ConversationMessage.objects.filter(chatwoot_pending=True)
    family = GaugeMetricFamily(
        "crm_chatwoot_waiting", "WhatsApp conversation messages waiting to be delivered to Chatwoot."
    )
    family.add_metric([], pending.count())
    yield family
    mirror = GaugeMetricFamily(
        "crm_chatwoot_mirror_waiting",
        "Of those, the campaign messages sent whose copy waits to be mirrored to Chatwoot.",
    )
    mirror.add_metric([], pending.filter(source=ConversationMessage.Source.CAMPAIGN).count())
    yield mirror


@contextlib.contextmanager
def _organization_lock(organization_id: int) -> Iterator[bool]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_LOCK_SPACE + organization_id])
        held = bool(cursor.fetchone()[0])
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [_LOCK_SPACE + organization_id])


def _account(organization_id: int) -> ChatwootAccount | None:
    try:
        account = ChatwootAccount.objects.get(organization_id=organization_id)
    except ObjectDoesNotExist:
        return None
    return account if account.enabled else None


def push(*, organization_id: int) -> int:
    """Deliver the organization's waiting messages to Chatwoot, oldest first, pass after pass while
    more were written during one; returns how many. Safe to run twice and concurrently (one at a
    time per organization; a delivered message is marked at once). Raises jobs.Defer while Chatwoot
    does not answer, keeping the organization's one pending push (PENDING)."""
    delivered = 0
    try:
        while True:
            done = _push_pass(organization_id)
            if done is None:  # another push is in its pass: it looks at the flag when it ends
                return delivered
            delivered += done
            if not PENDING.finish(organization_id):
                return delivered
    except _TokenRefused:
        # What waits stays for a fixed token (saving the account pushes) or `recover`; the marker
        # kept, writers meanwhile enqueue no push that would only be refused.
        PENDING.keep(organization_id, WAITING_TTL)
        return delivered
    except jobs.Defer:
        PENDING.keep(organization_id, WAITING_TTL)  # this deferred job is the organization's pending push
        raise
    except BaseException:
        PENDING.release(organization_id)  # a retry or `recover` runs it again; a writer may too
        raise


def _push_pass(organization_id: int) -> int | None:
    """One pass over what waits, holding the organization's lock (the flag cleared first); None
    when another push holds it."""
    account = _account(organization_id)
    if account is None:
        PENDING.begin(organization_id)
        # Chatwoot switched off: nothing waits for it any more.
        ConversationMessage.objects.filter(organization_id=organization_id, chatwoot_pending=True).update(
            chatwoot_pending=False
        )
        return 0
    with _organization_lock(organization_id) as held:
        if not held:
            return None
        PENDING.begin(organization_id)
        clients = _ThreadClients(account)
        try:
            return _push_all(clients, account)
        finally:
            clients.close()


class _ThreadClients:
    """One ChatwootClient (one connection) per push thread: httpcore's shared pool assigns every
    request by scanning all its connections (a readability poll each) under one lock, which, 64
    conversations side by side, cost the push's process more CPU than the requests themselves."""

    def __init__(self, account: ChatwootAccount) -> None:
        self._account, self._token = account, account.get_api_token()
        self._local = threading.local()
        self._made: list[ChatwootClient] = []
        self._lock = threading.Lock()

    def get(self) -> ChatwootClient:
        client: ChatwootClient | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = ChatwootClient(
                base_url=self._account.base_url,
                account_id=self._account.account_id,
                api_token=self._token,
                max_connections=1,
            )
            with self._lock:
                self._made.append(client)
        return client

    def close(self) -> None:
        with self._lock:
            for client in self._made:
                client.close()
            self._made.clear()


def _pending(organization_id: int, *, exclude: set[int], blocked: set[int]) -> list[ConversationMessage]:
    rows = ConversationMessage.objects.filter(organization_id=organization_id, chatwoot_pending=True)
    if exclude:
        rows = rows.exclude(id__in=exclude)
    if blocked:
        rows = rows.exclude(customer_id__in=blocked)
    return list(rows.select_related("customer", "store").order_by("id")[: PUSH_CHUNK - len(exclude)])


@dataclass
class _Outcome:
    """What one conversation's delivery did: the rows delivered in order (id, Chatwoot's id), the
    row that stopped it with its error, and the Chatwoot ids found or created on the way."""

    delivered: list[tuple[ConversationMessage, int]] = field(default_factory=list)
    stopped: tuple[ConversationMessage, IntegrationError] | None = None
    threads: dict[tuple[int, int], Thread] = field(default_factory=dict)


def _conversation(
    clients: _ThreadClients,
    account: ChatwootAccount,
    rows: list[ConversationMessage],
    *,
    known: dict[tuple[int, int], Thread],
) -> _Outcome:
    """Deliver one customer's rows in order, stopping at the first failure (later ones wait)."""
    outcome = _Outcome()
    client = clients.get()
    for row in rows:
        try:
            outcome.delivered.append((row, deliver(client, account, row, known, outcome.threads)))
        except IntegrationError as exc:
            outcome.stopped = (row, exc)
            break
    return outcome


class _Stream:
    """One push's conversations in flight: a customer's waiting rows go out as one group, in order,
    as soon as the customer has none in flight (no round waits for its slowest conversation);
    what comes back is written by the push's own thread."""

    def __init__(self, clients: _ThreadClients, account: ChatwootAccount, pool: ThreadPoolExecutor) -> None:
        self.clients, self.account, self.pool = clients, account, pool
        self.organization_id = account.organization_id
        self.blocked: set[int] = set()  # customers whose earlier message failed: later ones wait
        self.taken: set[int] = set()  # rows queued or in flight
        self.queued: dict[int, list[ConversationMessage]] = defaultdict(list)
        self.running: dict[Future[_Outcome], tuple[int, list[int]]] = {}  # -> its customer and rows
        self.known: dict[int, dict[tuple[int, int], Thread]] = defaultdict(dict)
        self.delivered = 0
        self.more = True  # rows may wait that no read took yet
        self.unwritten: list[_Outcome] = []  # came back, not written yet
        self.unwritten_ids: list[int] = []
        self.written_at = time.monotonic()

    def read(self) -> None:
        """Queue the waiting rows not taken yet, oldest first (a bounded number at a time): rows
        committed meanwhile, in whatever order their transactions commit. The database is asked
        at the pass's start, when the last read left rows for want of room, and when a writer says
        it committed more (the dirty flag, cleared before the read: a commit after it sets it
        again, and the pass's end looks at it), not every STREAM_POLL."""
        if len(self.taken) >= PUSH_CHUNK or not (self.more or PENDING.dirty(self.organization_id)):
            return
        PENDING.begin(self.organization_id)
        limit = PUSH_CHUNK - len(self.taken)
        rows = _pending(self.organization_id, exclude=self.taken, blocked=self.blocked)
        self.more = len(rows) >= limit
        _mark_taken(rows)
        new = {row.customer_id for row in rows} - self.known.keys()
        for (customer_id, inbox_id), thread in _known_threads(self.organization_id, list(new)).items():
            self.known[customer_id][(customer_id, inbox_id)] = thread
        for row in rows:
            self.queued[row.customer_id].append(row)
            self.taken.add(row.pk)

    def submit(self) -> None:
        busy = {customer_id for customer_id, _ in self.running.values()}
        for customer_id in [c for c in self.queued if c not in busy]:
            group = self.queued.pop(customer_id)
            known = dict(self.known[customer_id])
            future = self.pool.submit(_conversation, self.clients, self.account, group, known=known)
            self.running[future] = (customer_id, [row.pk for row in group])

    def collect(self, timeout: float | None) -> list[IntegrationError]:
        """Take what came back within `timeout` (None: everything in flight); returns the errors.
        The delivered rows are written every WRITE_EVERY seconds, when nothing is in flight or on
        an error, not one round trip per conversation (each costs this process time its
        conversations' threads wait for); until then they stay taken, never read again."""
        done, _ = wait(list(self.running), timeout=timeout, return_when=FIRST_COMPLETED)
        if timeout is None:
            done = set(self.running)
            wait(done)
        outcomes = [future.result() for future in done]
        for future in done:
            _, ids = self.running.pop(future)
            self.unwritten_ids.extend(ids)  # delivered (no longer waiting) or blocked, once written
        self.unwritten.extend(outcomes)
        for outcome in outcomes:
            for (customer_id, inbox_id), thread in outcome.threads.items():
                self.known[customer_id][(customer_id, inbox_id)] = thread
        errors = []
        for outcome in outcomes:
            if outcome.stopped is not None:
                row, exc = outcome.stopped
                _note(row, exc)
                self.blocked.add(row.customer_id)
                self.taken.difference_update(r.pk for r in self.queued.pop(row.customer_id, []))
                errors.append(exc)
        if errors or not self.running or time.monotonic() - self.written_at >= WRITE_EVERY:
            self.write()
        return errors

    def write(self) -> None:
        """Mark what was delivered since the last write, and keep the Chatwoot ids found (one
        transaction)."""
        if self.unwritten:
            with transaction.atomic():
                self.delivered += _record(self.unwritten)
                _keep_threads(self.organization_id, self.unwritten)
        self.taken.difference_update(self.unwritten_ids)
        self.unwritten, self.unwritten_ids = [], []
        self.written_at = time.monotonic()


def _push_all(clients: _ThreadClients, account: ChatwootAccount) -> int:
    """Conversations side by side (CHATWOOT_PUSH_CONCURRENCY), each in order; every STREAM_POLL
    seconds while conversations are in flight, what came back is taken and rows a writer committed
    meanwhile are read (`_Stream.read`); a Chatwoot down or a refused token ends the push once
    what is in flight came back and was written."""
    with ThreadPoolExecutor(max_workers=_concurrency(), thread_name_prefix="chatwoot-push") as pool:
        stream = _Stream(clients, account, pool)
        kept = time.monotonic()
        while True:
            if time.monotonic() - kept >= PENDING.ttl / 3:  # alive: the marker lives on
                PENDING.keep(account.organization_id)
                kept = time.monotonic()
            stream.read()
            stream.submit()
            if not stream.running:
                return stream.delivered
            errors = stream.collect(STREAM_POLL)
            if any(e.retryable or e.status in _ACCOUNT_LEVEL_STATUSES for e in errors):
                errors += stream.collect(None)
                _raise_for(account, errors)


def _mark_taken(rows: list[ConversationMessage]) -> None:
    """Say in the database, before any is posted, that these rows may reach Chatwoot without
    being marked delivered (a push killed between a post and its write, which comes every
    WRITE_EVERY): the push that takes them next looks for each before posting it again. The rows
    in hand keep what they said, so this push posts without looking (one statement per read)."""
    fresh = [row.pk for row in rows if not row.chatwoot_error.startswith(MAYBE_DELIVERED)]
    if fresh:
        ConversationMessage.objects.filter(pk__in=fresh, chatwoot_pending=True).update(chatwoot_error=TAKEN)


def _known_threads(organization_id: int, customer_ids: list[int]) -> dict[tuple[int, int], Thread]:
    """(customer id, inbox id) -> the Chatwoot ids kept for these customers."""
    return {
        (customer_id, inbox_id): (contact_id, conversation_id)
        for customer_id, inbox_id, contact_id, conversation_id in ChatwootThread.objects.filter(
            organization_id=organization_id, customer_id__in=customer_ids
        ).values_list("customer_id", "inbox_id", "contact_id", "conversation_id")
    }


def _keep_threads(organization_id: int, outcomes: list[_Outcome]) -> None:
    """The Chatwoot ids found or created in this pass, for the customers' next messages."""
    found = [
        ChatwootThread(
            organization_id=organization_id,
            customer_id=customer_id,
            inbox_id=inbox_id,
            contact_id=contact_id,
            conversation_id=conversation_id,
        )
        for outcome in outcomes
        for (customer_id, inbox_id), (contact_id, conversation_id) in outcome.threads.items()
    ]
    if found:
        ChatwootThread.objects.bulk_create(
            found,
            update_conflicts=True,
            unique_fields=["customer", "inbox_id", "organization"],
            update_fields=["contact_id", "conversation_id"],
        )


def _record(outcomes: list[_Outcome]) -> int:
    """Mark the delivered rows (two statements): no longer waiting, and each inbound one with its
    Chatwoot id (an agent's reply keeps its own)."""
    delivered = [(row, chatwoot_id) for outcome in outcomes for row, chatwoot_id in outcome.delivered]
    if not delivered:
        return 0
    done = ConversationMessage.objects.filter(
        pk__in=[row.pk for row, _ in delivered], chatwoot_pending=True
    ).update(chatwoot_pending=False, chatwoot_error="")
    inbound = []
    for row, chatwoot_id in delivered:
        if row.direction == row.Direction.INBOUND:
            row.chatwoot_message_id = chatwoot_id or None  # 0: posted, its id not shown
            inbound.append(row)
    ConversationMessage.objects.bulk_update(inbound, ["chatwoot_message_id"])
    return done


def _raise_for(account: ChatwootAccount, errors: list[IntegrationError]) -> None:
    """Chatwoot not answering defers the push (no attempt spent); a refused token ends it (the
    recovery pass tries again every minute); another refusal blocks only its conversation."""
    retryable = next((e for e in errors if e.retryable), None)
    if retryable is not None:
        raise jobs.Defer(DOWN_DEFER, f"Chatwoot did not answer: {retryable}")
    refused = next((e for e in errors if e.status in _ACCOUNT_LEVEL_STATUSES), None)
    if refused is not None:
        logger.error(
            "chatwoot push: account %s refused our token (%s); %s message(s) wait",
            account.pk,
            refused,
            waiting(account.organization_id).get(account.organization_id, 0),
            extra={"organization_id": account.organization_id},
        )
        raise _TokenRefused


class _TokenRefused(Exception):
    pass


def _note(row: ConversationMessage, exc: IntegrationError) -> None:
    details = f" — {exc.details}" if exc.details else ""
    maybe = MAYBE_DELIVERED if exc.maybe_delivered else ""
    ConversationMessage.objects.filter(pk=row.pk).update(chatwoot_error=f"{maybe}{exc}{details}"[:1000])


@recovery.register("chatwoot-inbound")
def _waiting_pushes() -> Iterator[jobs.JobSpec]:
    """A push for every organization with messages waiting for Chatwoot over 30 s (a lost job, a
    token refused meanwhile, a Chatwoot that was down)."""
    cutoff = timezone.now() - timedelta(seconds=30)
    organizations = (
        ConversationMessage.objects.filter(chatwoot_pending=True, created_at__lt=cutoff)
        .values_list("organization_id", flat=True)
        .distinct()
    )
    for organization_id in organizations:
        yield jobs.JobSpec(
            func=PUSH_TASK,
            queue=queues.CHATWOOT_INBOUND,
            kwargs={"organization_id": organization_id},
            job_id=push_job_id(organization_id),
            organization_id=organization_id,
        )
