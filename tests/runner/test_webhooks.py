from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import httpx

from crm import inbox
from runner.models import Execution, ExecutionItem, Handler
from runner.views import signature

SECRET = "whsec-test-0123456789"


def _hmac_handler(py_handler: Handler) -> Handler:
    py_handler.webhook_auth = Handler.WebhookAuth.HMAC
    py_handler.set_webhook_secret(SECRET)
    py_handler.save()
    return py_handler


def _post(client, body: bytes, **headers):
    return client.post("/hooks/crm-x/leads", data=body, content_type="application/json", headers=headers)


def test_a_signed_webhook_is_stored_as_an_item_and_answered_202(client, py_handler, drain_inbox):
    _hmac_handler(py_handler)
    body = json.dumps({"id": "evt-1", "lead": "Ana"}).encode()
    response = _post(client, body, **{"X-Runner-Signature": signature(SECRET, body)})
    assert response.status_code == 202
    # Accepted into the inbox: the worker draining it creates the execution the answer named.
    assert inbox.pending("runner.webhook") == 1 and not Execution.objects.exists()
    drain_inbox()
    assert inbox.pending() == 0
    item = ExecutionItem.objects.select_related("execution").get()
    assert item.execution_id == response.json()["execution_id"]
    assert item.external_id == "evt-1" and item.payload == {"id": "evt-1", "lead": "Ana"}
    assert item.execution.trigger == "webhook" and item.execution.status == "running"


def test_a_bad_or_missing_signature_is_refused_and_nothing_is_stored(client, py_handler):
    _hmac_handler(py_handler)
    body = b'{"id": "evt-1"}'
    assert _post(client, body).status_code == 401
    assert _post(client, body, **{"X-Runner-Signature": signature("wrong", body)}).status_code == 401
    tampered = _post(client, b'{"id": "evt-2"}', **{"X-Runner-Signature": signature(SECRET, body)})
    assert tampered.status_code == 401
    assert not Execution.objects.exists()


def test_a_token_handler_refuses_a_wrong_token_and_accepts_the_right_one(client, py_handler, drain_inbox):
    py_handler.webhook_auth = Handler.WebhookAuth.TOKEN
    py_handler.set_webhook_secret(SECRET)
    py_handler.save()
    assert _post(client, b"{}", Authorization="Bearer nope").status_code == 401
    assert _post(client, b"{}").status_code == 401
    drain_inbox()
    assert not ExecutionItem.objects.exists()
    assert _post(client, b"{}", Authorization=f"Bearer {SECRET}").status_code == 202
    drain_inbox()
    assert ExecutionItem.objects.count() == 1


def test_a_handler_without_a_secret_accepts_no_webhook(client, py_handler):
    assert _post(client, b"{}", Authorization="Bearer ").status_code == 401
    assert client.post("/hooks/crm-x/unknown", data=b"{}", content_type="application/json").status_code == 404
    assert not Execution.objects.exists()


def test_a_burst_of_1000_concurrent_webhooks_is_accepted_in_full_and_processed(
    web_server, py_handler, run_jobs
):
    """Seed 004's burst: a thousand webhooks at once, against the production web server, are all
    accepted and each becomes one item that is processed."""
    _hmac_handler(py_handler)
    url = f"{web_server}/hooks/crm-x/leads"

    async def burst() -> list[int]:
        timeout = aiohttp.ClientTimeout(total=120)
        connector = aiohttp.TCPConnector(limit=1000)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

            async def send(i: int) -> int:
                body = json.dumps({"id": f"evt-{i}"}).encode()
                headers = {"Content-Type": "application/json", "X-Runner-Signature": signature(SECRET, body)}
                async with session.post(url, data=body, headers=headers) as response:
                    return response.status

            return await asyncio.gather(*(send(i) for i in range(1000)))

    statuses = asyncio.run(burst())
    assert statuses.count(202) == 1000
    run_jobs()
    assert ExecutionItem.objects.count() == 1000
    assert ExecutionItem.objects.filter(status="succeeded").count() == 1000
    assert set(ExecutionItem.objects.values_list("external_id", flat=True)) == {
        f"evt-{i}" for i in range(1000)
    }
    assert not Execution.objects.exclude(status="completed").exists()


def test_a_retried_event_is_stored_once_and_answered_with_the_first_execution(
    client, py_handler, drain_inbox
):
    _hmac_handler(py_handler)
    body = json.dumps({"id": "order-7", "total": 10}).encode()
    headers = {"X-Runner-Signature": signature(SECRET, body), "X-Event-Id": "evt-retry"}
    first = _post(client, body, **headers)
    again = _post(client, body, **headers)
    assert first.status_code == 202
    assert again.status_code == 200
    assert again.json() == {"execution_id": first.json()["execution_id"], "status": "duplicate"}
    drain_inbox()
    assert ExecutionItem.objects.count() == 1 and Execution.objects.count() == 1
    assert ExecutionItem.objects.get().external_id == "evt-retry"
    # Without an event id there is nothing to recognise a retry by: each delivery is stored, and a
    # body's own `id` names the record (an order updated twice), not the event.
    anonymous = json.dumps({"total": 10}).encode()
    for _ in range(2):
        assert (
            _post(client, anonymous, **{"X-Runner-Signature": signature(SECRET, anonymous)}).status_code
            == 202
        )
    for _ in range(2):
        assert _post(client, body, **{"X-Runner-Signature": signature(SECRET, body)}).status_code == 202
    drain_inbox()
    assert ExecutionItem.objects.count() == 5
    assert ExecutionItem.objects.filter(external_id="order-7").count() == 2


def test_long_event_ids_are_compared_whole_not_cut_to_the_column(client, py_handler, drain_inbox):
    """Two ids that share their first 200 characters are two events; the same long id twice is one."""
    from runner.models import WebhookEvent

    _hmac_handler(py_handler)
    body = b'{"total": 10}'
    prefix = "evt-" + "x" * 300

    def post(event_id: str):
        return _post(client, body, **{"X-Runner-Signature": signature(SECRET, body), "X-Event-Id": event_id})

    assert post(prefix + "-a").status_code == 202
    assert post(prefix + "-b").status_code == 202
    again = post(prefix + "-a")
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    drain_inbox()
    assert ExecutionItem.objects.count() == 2
    recorded = list(WebhookEvent.objects.values_list("event_id", flat=True))
    assert len(set(recorded)) == 2 and all(len(i) <= 200 for i in recorded)


def test_concurrent_deliveries_of_one_event_store_it_once(live_server, py_handler, drain_inbox):
    _hmac_handler(py_handler)
    url = f"{live_server.url}/hooks/crm-x/leads"
    body = json.dumps({"total": 1}).encode()
    headers = {
        "Content-Type": "application/json",
        "X-Runner-Signature": signature(SECRET, body),
        "X-Event-Id": "evt-raced",
    }

    def send(_: int) -> tuple[int, int]:
        with httpx.Client(timeout=30) as c:
            r = c.post(url, content=body, headers=headers)
        return r.status_code, r.json()["execution_id"]

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(send, range(16)))
    assert sorted(status for status, _ in answers) == [200] * 15 + [202]
    assert len({execution for _, execution in answers}) == 1
    drain_inbox()
    assert ExecutionItem.objects.filter(external_id="evt-raced").count() == 1


def test_event_ids_are_forgotten_after_their_keep(client, py_handler, drain_inbox):
    from datetime import timedelta

    from django.utils import timezone

    from runner import events
    from runner.models import WebhookEvent

    _hmac_handler(py_handler)
    body = json.dumps({"total": 1}).encode()
    headers = {"X-Runner-Signature": signature(SECRET, body), "X-Event-Id": "evt-old"}
    assert _post(client, body, **headers).status_code == 202
    assert _post(client, body, **headers).status_code == 200  # remembered
    assert events.webhook_events_prune() == 0
    WebhookEvent.objects.update(received_at=timezone.now() - events.WEBHOOK_EVENT_KEEP - timedelta(minutes=1))
    assert events.webhook_events_prune() == 1
    # Forgotten: the same id is an event again.
    assert _post(client, body, **headers).status_code == 202
    drain_inbox()
    assert ExecutionItem.objects.filter(external_id="evt-old").count() == 2


def test_the_prune_cron_forgets_every_old_event_id_beyond_one_statements_worth(py_handler, org):
    from datetime import timedelta

    from django.utils import timezone

    from crm import cron
    from runner import events, tasks
    from runner.models import WebhookEvent

    old = timezone.now() - events.WEBHOOK_EVENT_KEEP - timedelta(minutes=1)
    WebhookEvent.objects.bulk_create(
        [WebhookEvent(handler=py_handler, organization=org, event_id=f"e{i}") for i in range(10_005)]
    )
    WebhookEvent.objects.update(received_at=old)  # auto_now_add: aged after the insert
    WebhookEvent.objects.create(handler=py_handler, organization=org, event_id="recent")
    assert tasks.webhook_events_prune() == 10_005
    assert list(WebhookEvent.objects.values_list("event_id", flat=True)) == ["recent"]
    entry = cron.cron_table()["runner-event-ids-prune"]
    assert (entry.func, entry.cron) == ("runner.tasks.webhook_events_prune", "*/10 * * * *")


def test_one_group_commit_statement_sorts_deliveries_repeats_and_anonymous_events(db, py_handler):
    """The intake's statement for many requests at once (what one group commit runs): the first row
    of an event id creates its execution, later rows with that id (in the same statement or after
    an earlier one) learn that execution, rows without an id each create one, and only created
    rows reach the inbox, in request order."""
    from django.db import connection
    from django.utils import timezone

    from crm.models import InboxEvent
    from runner import events

    org_id = py_handler.organization_id
    earlier, _ = events.webhook_receive(
        handler=py_handler, organization_id=org_id, event_id="old", payload={}
    )
    InboxEvent.objects.all().delete()
    now = timezone.now()
    keys = ["a", "b", "", "a", "old", "", "b", "c"]
    rows = [[py_handler.pk, org_id, key, f"x{i}", json.dumps({"i": i}), now] for i, key in enumerate(keys)]
    statement = events._RECEIVE
    with connection.cursor() as cursor:
        cursor.execute(statement.sql_rendered, statement.params(rows))
        found = {n: (created, repeat) for n, created, repeat in cursor.fetchall()}
    results = [found[i + 1] for i in range(len(keys))]
    created = {i: c for i, (c, _) in enumerate(results) if c is not None}
    assert sorted(created) == [0, 1, 2, 5, 7]  # a, b, two anonymous, c
    assert len(set(created.values())) == 5
    assert results[3] == (None, created[0]) and results[6] == (None, created[1])  # repeats in the batch
    assert results[4] == (None, earlier)  # a repeat of an event stored before
    stored = [json.loads(p) for p in InboxEvent.objects.order_by("id").values_list("payload", flat=True)]
    assert [s["payload"]["i"] for s in stored] == [0, 1, 2, 5, 7]
    assert [s["execution_id"] for s in stored] == [created[i] for i in (0, 1, 2, 5, 7)]


def test_concurrent_requests_in_one_group_commit_store_each_event_once(transactional_db, py_handler):
    """Threads of one web process accepting at once (their rows share group commits): each event id
    is stored once, its repeats answered with its execution; anonymous events are each stored."""
    import threading

    from django.db import connection

    from crm.models import InboxEvent
    from runner import events

    keys = [f"evt-{i % 10}" for i in range(30)] + [""] * 10
    results: dict[int, tuple[int | None, bool]] = {}
    start = threading.Barrier(len(keys))

    def receive(i: int) -> None:
        start.wait()
        try:
            results[i] = events.webhook_receive(
                handler=py_handler,
                organization_id=py_handler.organization_id,
                event_id=keys[i],
                payload={"i": i},
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=receive, args=(i,)) for i in range(len(keys))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == len(keys)
    for key in {k for k in keys if k}:
        answers = [results[i] for i, k in enumerate(keys) if k == key]
        assert sorted(duplicate for _, duplicate in answers) == [False, True, True]
        assert len({execution for execution, _ in answers}) == 1
    anonymous = [results[i] for i, k in enumerate(keys) if not k]
    assert all(not duplicate for _, duplicate in anonymous) and len({e for e, _ in anonymous}) == 10
    assert InboxEvent.objects.filter(kind=events.WEBHOOK_KIND).count() == 20
