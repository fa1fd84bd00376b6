"""The webhook inbox (crm/inbox.py) through the real stack: gunicorn, worker processes, PostgreSQL
and Redis; what is accepted is applied exactly once whoever dies, statuses stay monotonic in any
order, and an unreachable database answers 503."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns.models import Campaign, CampaignMetric, Channel, EmailMessage, WhatsappMessage
from crm import inbox, inbox_intake, inbox_kinds, recovery
from crm.models import Customer, Organization
from runner.models import ExecutionItem, Handler, IntegrationType, RunnerSettings
from tests.conftest import ROOT, child_env, free_port, wait_for

APP_SECRET = "meta-app-secret-for-inbox-tests"
TOKEN = "runner-token-for-inbox-tests-0123"
T0 = 1_731_700_000
S = WhatsappMessage.Status


def _meta_body(wamid: str, status: str, ts: int = T0) -> bytes:
    value = {
        "messaging_product": "whatsapp",
        "metadata": {"phone_number_id": "1"},
        "statuses": [{"id": wamid, "status": status, "timestamp": str(ts), "recipient_id": "5511900000000"}],
    }
    return json.dumps(
        {
            "object": "whatsapp_business_account",
            "entry": [{"id": "1", "changes": [{"field": "messages", "value": value}]}],
        }
    ).encode()


def _signed(body: bytes) -> dict[str, str]:
    digest = hmac.new(APP_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-Hub-Signature-256": f"sha256={digest}"}


def _campaign(n: int) -> tuple[Campaign, list[WhatsappMessage]]:
    org = Organization.objects.create(name="Loja Inbox", slug=f"inbox-{time.monotonic_ns()}")
    campaign = Campaign.objects.create(organization=org, name="Inbox", status=Campaign.Status.SENDING)
    CampaignMetric.objects.create(campaign=campaign, queued=n, sent=n)
    people = Customer.objects.bulk_create(
        [
            Customer(organization=org, erp_id=f"I{i}", name=f"Cliente {i}", phone=f"+55119{60000000 + i}")
            for i in range(n)
        ]
    )
    messages = WhatsappMessage.objects.bulk_create(
        [
            WhatsappMessage(
                campaign=campaign,
                organization=org,
                customer=c,
                status=S.SENT,
                phone=c.phone,
                wa_id=c.phone.lstrip("+"),
                wamid=f"wamid.INBOX{c.pk}",
                sent_at=timezone.now(),
            )
            for c in people
        ]
    )
    return campaign, messages


ESP_AUTH = "esp:pw-for-inbox-tests"


def _email_campaign(org: Organization, n: int) -> tuple[Campaign, list[EmailMessage]]:
    campaign = Campaign.objects.create(
        organization=org, name="Inbox e-mail", channel=Channel.EMAIL, status=Campaign.Status.SENT
    )
    CampaignMetric.objects.create(campaign=campaign, queued=n, sent=n, delivered=n)
    people = Customer.objects.bulk_create(
        [Customer(organization=org, name=f"Leitor {i}", email=f"leitor{i}@example.com.br") for i in range(n)]
    )
    messages = EmailMessage.objects.bulk_create(
        [
            EmailMessage(
                campaign=campaign,
                organization=org,
                customer=c,
                status=EmailMessage.Status.SENT,
                email=c.email,
                esp_message_id=f"pm-inbox-{c.pk}",
            )
            for c in people
        ]
    )
    return campaign, messages


def _postmark_open(message: EmailMessage) -> Request:
    body = {"RecordType": "Open", "MessageID": message.esp_message_id, "Recipient": message.email}
    auth = "Basic " + base64.b64encode(ESP_AUTH.encode()).decode()
    headers = {"Content-Type": "application/json", "Authorization": auth}
    return ("/anymail/postmark/tracking/", json.dumps(body).encode(), headers)


def _runner_handler(org: Organization) -> Handler:
    it = IntegrationType.objects.create(integration_key="inbox-x", name="Inbox X")
    handler = Handler(
        integration=it,
        handler_key="events",
        direction="inbound",
        kind=Handler.Kind.PYTHON,
        callable_path="tests.runner.handlers.noop",
        organization=org,
        concurrency=1000,
        webhook_auth=Handler.WebhookAuth.TOKEN,
    )
    handler.set_webhook_secret(TOKEN)
    handler.save()
    RunnerSettings.objects.create(organization=org, rate_limit_per_minute=1_000_000)
    return handler


class Web:
    """The production intake server (gunicorn as the README runs it for webhooks: each worker on its
    own SO_REUSEPORT socket), restartable on its port."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.env = env
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, ready_status: int = 404) -> None:
        from project.management.commands.up import manage_gunicorn

        self.proc = subprocess.Popen(
            [*manage_gunicorn(reuse_port=True), "--bind", f"127.0.0.1:{self.port}", "--backlog", "2048"],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def answers() -> bool:
            try:
                return (
                    httpx.post(f"{self.url}/hooks/no/such", content=b"{}", timeout=2).status_code
                    == ready_status
                )
            except httpx.HTTPError:
                return False

        wait_for(answers, timeout=60, interval=0.2, what="gunicorn to answer")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)


@pytest.fixture
def web() -> Iterator[Any]:
    started: list[Web] = []

    def _make(**env: str) -> Web:
        server = Web(child_env(WHATSAPP_APP_SECRET=APP_SECRET, **env))
        started.append(server)
        return server

    yield _make
    for server in started:
        server.kill(signal.SIGTERM)


Request = tuple[str, bytes, dict[str, str]]


async def _send(base: str, requests: list[Request], *, in_flight: int, on_answer: Any = None) -> list[Any]:
    """POST every request, `in_flight` at a time; each answer is (status, JSON) or None (no answer)."""
    answers: list[Any] = [None] * len(requests)
    pending = list(range(len(requests)))
    timeout = aiohttp.ClientTimeout(total=60)

    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=in_flight)) as s:

        async def client() -> None:
            while pending:
                i = pending.pop(0)
                path, body, headers = requests[i]
                try:
                    async with s.post(base + path, data=body, headers=headers) as response:
                        answers[i] = (response.status, await response.json(content_type=None))
                except (TimeoutError, aiohttp.ClientError, ValueError):
                    answers[i] = None
                if on_answer is not None:
                    on_answer(answers)

        await asyncio.gather(*(client() for _ in range(in_flight)))
    return answers


def test_every_accepted_event_is_applied_once_when_the_web_process_and_a_worker_die_mid_burst(
    transactional_db, web, worker_process
):
    """A burst of Meta statuses, runner webhooks and ESP opens; the web server (every gunicorn
    process) and the worker pool are SIGKILLed mid-burst and restarted; the sender resends what got
    no 2xx. Every event answered 2xx is applied, and exactly once: each message delivered (or
    opened) and counted once, one item per runner event id, each run once."""
    n = 300
    campaign, messages = _campaign(n)
    handler = _runner_handler(campaign.organization)
    email_campaign, emails = _email_campaign(campaign.organization, n)
    requests: list[Request] = []
    for i, (message, email) in enumerate(zip(messages, emails, strict=True)):
        requests.append(_postmark_open(email))
        body = _meta_body(message.wamid or "", "delivered")
        requests.append(("/webhooks/whatsapp/", body, _signed(body)))
        hook = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {TOKEN}",
            "X-Event-Id": f"evt-{i}",
        }
        requests.append(("/hooks/inbox-x/events", json.dumps({"n": i}).encode(), hook))
    server = web(ANYMAIL_WEBHOOK_SECRET=ESP_AUTH)
    server.start()
    workers = worker_process("--processes", "2")
    killed = {"done": False}

    def kill_midway(answers: list[Any]) -> None:
        if not killed["done"] and sum(1 for a in answers if a is not None) >= len(requests) // 3:
            killed["done"] = True
            server.kill()
            workers.kill()

    answers = asyncio.run(_send(server.url, requests, in_flight=50, on_answer=kill_midway))
    assert killed["done"]
    accepted_before = {i for i, a in enumerate(answers) if a is not None and 200 <= a[0] < 300}
    assert 0 < len(accepted_before) < len(requests)
    # Restarted: the provider resends whatever got no 2xx (no answer at all, for most).
    server.start()
    worker_process("--processes", "2")
    again = [i for i in range(len(requests)) if i not in accepted_before]
    answers_again = asyncio.run(_send(server.url, [requests[i] for i in again], in_flight=50))
    assert all(a is not None and a[0] in (200, 202) for a in answers_again), answers_again[:5]

    items = ExecutionItem.objects.filter(execution__handler=handler)

    def applied() -> bool:
        recovery.recover()  # the scheduler's every-minute pass: drains events whose wake-up died
        return (
            WhatsappMessage.objects.filter(campaign=campaign, status=S.DELIVERED).count() == n
            and items.filter(status="succeeded").count() >= n
            and EmailMessage.objects.filter(campaign=email_campaign, opened_at__isnull=False).count() == n
            and inbox.pending() == 0
        )

    wait_for(applied, timeout=180, interval=2, what="every accepted event applied")
    assert CampaignMetric.objects.get(campaign=campaign).delivered == n  # each status counted once
    assert CampaignMetric.objects.get(campaign=email_campaign).opened == n  # each open counted once
    assert sorted(items.values_list("external_id", flat=True)) == sorted(f"evt-{i}" for i in range(n))
    assert items.count() == n and items.filter(status="succeeded").count() == n
    # A resent runner event that had been stored before the kill is answered duplicate.
    for i, answer in zip(again, answers_again, strict=True):
        if requests[i][0].startswith("/hooks/") and answer[0] == 200:
            assert answer[1]["status"] == "duplicate" and answer[1]["execution_id"]


def test_an_unreachable_database_answers_503_with_retry_after_on_every_intake(db, web):
    """PostgreSQL down: nothing can be stored, so nothing is acknowledged — a 503 the sender retries."""
    closed = free_port()  # nothing listens there
    server = web(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{closed}/nothing", ANYMAIL_WEBHOOK_SECRET="esp:pw"
    )
    server.start(ready_status=503)
    body = _meta_body("wamid.DOWN", "delivered")
    hook = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}", "X-Event-Id": "e1"}
    for path, content, headers in [
        ("/webhooks/whatsapp/", body, _signed(body)),
        ("/hooks/inbox-x/events", b'{"n": 1}', hook),
        # django-anymail's view, guarded by the middleware
        (
            "/anymail/postmark/tracking/",
            json.dumps({"RecordType": "Open", "MessageID": "m-1", "Recipient": "a@example.com.br"}).encode(),
            {"Content-Type": "application/json", "Authorization": "Basic ZXNwOnB3"},  # esp:pw
        ),
    ]:
        response = httpx.post(server.url + path, content=content, headers=headers, timeout=30)
        assert response.status_code == 503, (path, response.text)
        assert response.headers["Retry-After"] == str(5)
        assert response.json()["ok"] is False and "database" in response.json()["error"]
    # Hostile input is still refused for what it is, before the database is needed.
    response = httpx.post(server.url + "/webhooks/whatsapp/", content=b'{"a": NaN}', timeout=30)
    assert response.status_code == 403  # unsigned


PERMUTED = st.permutations([("sent", 0), ("delivered", 5), ("read", 9)])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=PERMUTED, split=st.integers(min_value=0, max_value=3))
def test_statuses_of_one_message_in_any_order_and_batching_end_read_and_count_once(
    db, drain_inbox, order, split
):
    """Meta does not order its callbacks: whatever the order, and however they fall into drain
    batches, the message ends READ and each counter moves once."""
    campaign, (message,) = _campaign(1)
    bodies = [_meta_body(message.wamid or "", status, T0 + offset) for status, offset in order]
    for body in bodies[:split]:
        inbox_intake.accept(kind="whatsapp", payload=body.decode())
    drain_inbox()
    for body in bodies[split:]:
        inbox_intake.accept(kind="whatsapp", payload=body.decode())
    inbox_intake.accept(kind="whatsapp", payload=bodies[0].decode())  # a retried callback
    drain_inbox()
    message.refresh_from_db()
    assert message.status == S.READ
    assert message.delivered_at is not None and message.read_at is not None
    metric = CampaignMetric.objects.get(campaign=campaign)
    assert (metric.sent, metric.delivered, metric.read, metric.failed) == (1, 1, 1, 0)
    assert inbox.pending() == 0


def test_an_event_its_handler_refuses_alone_is_set_aside_and_the_rest_of_the_batch_applied(db, drain_inbox):
    _, (message,) = _campaign(1)
    inbox_intake.accept(kind="whatsapp", payload='{"object": "not whatsapp"}')  # passed no intake: poison
    inbox_intake.accept(kind="whatsapp", payload=_meta_body(message.wamid or "", "read").decode())
    drain_inbox()
    message.refresh_from_db()
    assert message.status == S.READ
    from crm.models import InboxEvent

    (poison,) = InboxEvent.objects.all()
    assert poison.failed_at is not None and "unexpected object" in poison.error
    assert inbox.pending() == 0  # set aside: never drained again


def test_the_safety_sweep_drains_every_kind_whose_wake_up_was_lost(db, django_capture_on_commit_callbacks):
    """Events older than SWEEP_AFTER and never drained (their wake-up died with Redis or the web
    process) get a drain job from the recovery pass, for every registered kind — whatever
    characters the kind's name has (RQ's job ids allow only letters, digits, "_" and "-")."""
    from crm.jobs import get_queue
    from crm.models import InboxEvent

    old = timezone.now() - inbox.SWEEP_AFTER * 2
    for kind in inbox_kinds.kinds():
        InboxEvent.objects.create(kind=kind, payload="{}", received_at=old)
    with django_capture_on_commit_callbacks(execute=True):
        result = recovery.recover()
    assert result["inbox"] == len(inbox_kinds.kinds()) >= 3  # whatsapp, esp, runner.webhook
    queued = get_queue(inbox.queues.INBOX).get_jobs()
    assert sorted(job.kwargs["kind"] for job in queued) == inbox_kinds.kinds()


def test_a_write_that_fails_in_a_group_commit_fails_alone(transactional_db):
    """Concurrent request writes share one pipelined transaction; when one statement fails (here a
    payload PostgreSQL refuses), only its caller gets the error: the others are committed."""
    import threading

    from django.db import DataError, IntegrityError

    from crm.models import InboxEvent

    statement = inbox_intake.Statement(
        f"WITH ins AS (INSERT INTO {InboxEvent._meta.db_table} (kind, organization_id, payload, error) "  # noqa: S608
        "SELECT kind, NULL, payload, '' FROM requests ORDER BY n RETURNING id, payload) "
        "SELECT r.n, ins.id FROM requests r JOIN ins USING (payload)",
        (("kind", "text"), ("payload", "text")),
    )
    payloads = [f'{{"n": {i}}}' for i in range(40)]
    payloads[17] = None  # payload is NOT NULL: this one statement fails
    results: dict[int, object] = {}
    start = threading.Barrier(len(payloads))

    def write(i: int) -> None:
        start.wait()
        try:
            results[i] = inbox_intake.write(statement, ["whatsapp", payloads[i]])
        except (IntegrityError, DataError) as exc:
            results[i] = exc
        finally:
            from django.db import connection

            connection.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(payloads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert isinstance(results[17], IntegrityError)
    stored = {i for i, r in results.items() if isinstance(r, tuple)}
    assert stored == set(range(len(payloads))) - {17}
    assert InboxEvent.objects.filter(kind="whatsapp").count() == len(payloads) - 1


def test_an_event_its_handler_cannot_apply_yet_is_kept_and_given_again_in_acceptance_order(
    db, monkeypatch, django_capture_on_commit_callbacks
):
    """A handler returns a Retry for what it cannot apply yet: the rest of the batch is applied and
    deleted, that event keeps only the payload left, is not taken before its retry is due (nor swept),
    then comes back in acceptance order among the new events — also when the batch had to be
    applied one event at a time around a poison event."""
    from crm.jobs import get_queue
    from crm.models import InboxEvent

    kind = "test.later"
    given: list[list[tuple[int, str]]] = []

    def handler(events: list[inbox_kinds.Event]) -> dict[int, inbox_kinds.Retry]:
        given.append([(e.retries, e.payload) for e in events])
        if any(e.payload == "poison" for e in events):
            raise ValueError("poison")
        return {
            e.id: inbox_kinds.Retry(payload=e.payload.replace("a+", ""), reason="not yet")
            for e in events
            if e.payload.startswith("a+")
        }

    monkeypatch.setitem(inbox_kinds._HANDLERS, kind, handler)
    for payload in ("a+b", "c", "poison"):
        inbox_intake.accept(kind=kind, payload=payload)
    with django_capture_on_commit_callbacks(execute=True) as wake_ups:
        assert inbox.drain_batch(kind) == 3
    assert given[0] == [(0, "a+b"), (0, "c"), (0, "poison")]  # the batch, then one by one
    assert given[1:] == [[(0, "a+b")], [(0, "c")], [(0, "poison")]]
    kept = InboxEvent.objects.get(failed_at__isnull=True)
    assert (kept.payload, kept.retries) == ("b", 1) and kept.not_before > timezone.now()
    assert InboxEvent.objects.get(failed_at__isnull=False).payload == "poison"
    # its wake-up: a drain of the kind delayed until the retry is due
    assert len(wake_ups) == 1
    queue = get_queue(inbox.queues.INBOX)
    (delayed,) = [queue.fetch_job(job_id) for job_id in queue.scheduled_job_registry.get_job_ids()]
    assert (
        delayed is not None
        and delayed.kwargs == {"kind": kind}
        and delayed.id.startswith("inbox-retry-test-later-")
    )

    given.clear()
    assert inbox.drain_batch(kind) == 0 and not given  # not due
    assert inbox.pending(kind) == 1
    assert not any(spec.kwargs["kind"] == kind for spec in inbox.stranded())  # nor the sweep's
    inbox_intake.accept(kind=kind, payload="d")
    assert inbox.drain_batch(kind) == 1 and given == [[(0, "d")]]

    InboxEvent.objects.filter(pk=kept.pk).update(not_before=timezone.now() - inbox.SWEEP_AFTER * 2)
    assert [spec.kwargs["kind"] for spec in inbox.stranded() if spec.kwargs["kind"] == kind] == [kind]
    inbox_intake.accept(kind=kind, payload="e")
    given.clear()
    assert inbox.drain_batch(kind) == 2
    assert given == [[(1, "b"), (0, "e")]]  # the older one first, with what was left of it
    assert inbox.pending(kind) == 0


def test_set_aside_events_are_deleted_a_month_later_and_not_before(db):
    from datetime import timedelta

    from crm import tasks
    from crm.models import InboxEvent

    now = timezone.now()
    old = InboxEvent.objects.create(
        kind="esp", payload="{}", failed_at=now - inbox.SET_ASIDE_KEEP - timedelta(hours=1)
    )
    recent = InboxEvent.objects.create(kind="esp", payload="{}", failed_at=now - timedelta(days=1))
    waiting = InboxEvent.objects.create(kind="esp", payload="{}")
    assert tasks.inbox_set_aside_prune() == 1
    assert set(InboxEvent.objects.values_list("id", flat=True)) == {recent.pk, waiting.pk}
    assert not InboxEvent.objects.filter(pk=old.pk).exists()


def test_the_group_commit_thread_closes_its_connection_when_asked_not_only_when_idle(
    transactional_db, monkeypatch
):
    from django.db import connection

    from crm.models import InboxEvent

    statement = inbox_intake.Statement(
        f"WITH ins AS (INSERT INTO {InboxEvent._meta.db_table} (kind, organization_id, payload, error) "  # noqa: S608
        "SELECT kind, NULL, payload, '' FROM requests ORDER BY n RETURNING id, payload) "
        "SELECT r.n, ins.id FROM requests r JOIN ins USING (payload)",
        (("kind", "text"), ("payload", "text")),
    )
    monkeypatch.setattr(inbox_intake, "GROUP_IDLE_CLOSE", 600.0)  # it would not close on its own
    inbox_intake.group_commit_close(timeout=60)

    def others() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]

    before = others()
    inbox_intake.write(statement, ["whatsapp", '{"n": 1}'])  # the thread now holds a connection
    assert others() == before + 1
    assert inbox_intake.group_commit_close(timeout=60)  # at once, not after GROUP_IDLE_CLOSE
    # The server ends the backend a moment after the client closes: wait for it (a hang guard only;
    # GROUP_IDLE_CLOSE is 600 s here, so a thread that kept its connection still fails).
    wait_for(lambda: others() == before, timeout=60, what="the group commit's backend to end")
    inbox_intake.write(statement, ["whatsapp", '{"n": 2}'])  # and it reconnects for the next write
    assert InboxEvent.objects.count() == 2
