"""Fair share per tenant: within a queue, tenants with work waiting are served in turn."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crm import fairshare, jobs, stats, workers
from tests.conftest import recorded

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "items-p3"


def _flood(org: int, n: int, *, queue: str = QUEUE, key: str = "order") -> None:
    jobs.enqueue_many(
        "tests.jobs.record",
        queue=queue,
        kwargs_list=[{"key": key, "value": f"{org}:{i}"} for i in range(n)],
        organization_id=org,
    )


def _worker_run(queues: list[str], max_jobs: int | None = None) -> None:
    workers.make_worker(queues).work(burst=True, max_jobs=max_jobs, logging_level="WARNING")


def test_a_flooding_tenant_does_not_make_another_wait_behind_its_backlog():
    _flood(1, 300)  # tenant 1's backlog is queued first
    _flood(2, 5)
    _worker_run([QUEUE])
    order = [v.split(":")[0] for v in recorded("order")]
    assert len(order) == 305
    # Tenant 2's five jobs alternate with tenant 1's, not after its 300.
    last_of_2 = max(i for i, t in enumerate(order) if t == "2")
    assert last_of_2 <= 10, order[:20]
    assert order.count("2") == 5  # each exactly once


def test_a_higher_priority_job_of_any_tenant_passes_every_lower_priority_job():
    _flood(1, 50, queue="items-p5")
    _flood(2, 1, queue="items-p1")
    _worker_run(["items-p1", "items-p3", "items-p5"], max_jobs=1)
    assert recorded("order") == ["2:0"]


def test_a_long_job_gives_its_turn_to_work_on_a_queue_the_worker_serves_first():
    # Tenant 1's job in five chunks on items-p3; after its first chunk tenant 2's job arrives on
    # items-p1, which the worker serves first: it runs before the second chunk, not after the job.
    jobs.enqueue(
        "tests.jobs.chunked",
        queue=QUEUE,
        kwargs={"key": "order", "chunks": 5, "high_queue": "items-p1"},
        organization_id=1,
    )
    _worker_run(["items-p1", QUEUE])
    assert recorded("order") == ["chunk:0", "high", "chunk:1", "chunk:2", "chunk:3", "chunk:4"]


def test_a_long_job_alone_keeps_its_turn_whatever_waits_on_queues_served_after_it():
    jobs.enqueue(
        "tests.jobs.chunked",
        queue=QUEUE,
        kwargs={"key": "order", "chunks": 3, "high_queue": "items-p5"},
        organization_id=1,
    )
    _worker_run([QUEUE, "items-p5"])
    assert recorded("order") == ["chunk:0", "chunk:1", "chunk:2", "high"]


def test_a_tenant_with_weight_two_gets_two_turns_for_every_one_of_weight_one(redis_db):
    fairshare.set_weight(redis_db, 1, 2)
    _flood(1, 40)
    _flood(2, 40)
    _worker_run([QUEUE], max_jobs=30)
    order = [v.split(":")[0] for v in recorded("order")]
    assert 19 <= order.count("1") <= 21 and 9 <= order.count("2") <= 11, order


def test_jobs_without_a_tenant_take_their_turn_beside_the_tenants():
    _flood(1, 100)
    jobs.enqueue("tests.jobs.record", queue=QUEUE, kwargs={"key": "order", "value": "none:0"})
    _worker_run([QUEUE])
    order = recorded("order")
    assert order.index("none:0") <= 2 and len(order) == 101


def test_a_deleted_or_canceled_job_is_skipped_and_never_runs(redis_db):
    ids = jobs.enqueue_many(
        "tests.jobs.record",
        queue=QUEUE,
        kwargs_list=[{"key": "order", "value": str(i)} for i in range(3)],
        organization_id=7,
    )
    jobs.delete_job(ids[0])
    job = jobs.fetch_job(ids[1])
    assert job is not None
    job.cancel()
    _worker_run([QUEUE])
    assert recorded("order") == ["2"]
    assert fairshare.waiting(redis_db, [QUEUE]) == {QUEUE: 0}


def test_a_job_taken_by_a_worker_that_died_before_starting_it_runs_once_without_spending_an_attempt(
    redis_db,
):
    _flood(1, 1)
    picked = fairshare.pick(redis_db, [QUEUE])  # the turn taken; the worker dies here
    assert picked is not None
    _queue, job_id, tenant, _score = picked
    assert tenant == "1"
    assert redis_db.lrange(f"rq:queue:{QUEUE}:intermediate", 0, -1) == [job_id.encode()]
    assert fairshare.pick(redis_db, [QUEUE]) is None  # nobody else takes it meanwhile
    queue = jobs.get_queue(QUEUE)
    worker = workers.make_worker([QUEUE])
    queue.intermediate_queue.cleanup(worker, queue)  # first seen: left alone
    assert fairshare.waiting(redis_db, [QUEUE]) == {QUEUE: 0}
    # A minute later (the sweep's threshold) it goes back to the head of its tenant.
    first_seen = queue.intermediate_queue.get_first_seen_key(job_id)
    redis_db.set(first_seen, time.time() - 120)
    queue.intermediate_queue.cleanup(worker, queue)
    assert redis_db.llen(f"rq:queue:{QUEUE}:intermediate") == 0
    assert fairshare.queued_ids(redis_db, QUEUE) == [job_id]
    _worker_run([QUEUE])
    assert recorded("order") == ["1:0"]
    job = jobs.fetch_job(job_id)
    assert job is not None and job.get_status() == "finished"
    assert job.retries_left == 2  # attempts untouched


def test_unique_enqueue_of_a_fair_job_queues_it_once(redis_db):
    for _ in range(3):
        jobs.enqueue(
            "tests.jobs.record",
            queue=QUEUE,
            kwargs={"key": "order", "value": "x"},
            job_id="fair-unique",
            unique=True,
            organization_id=3,
        )
    assert fairshare.queued_ids(redis_db, QUEUE) == ["fair-unique"]
    _worker_run([QUEUE])
    assert recorded("order") == ["x"]


def test_a_queue_not_marked_fair_keeps_its_single_fifo(redis_db):
    _flood(1, 2, queue="erp-sync-queue")
    assert redis_db.llen("rq:queue:erp-sync-queue") == 2
    assert fairshare.waiting(redis_db, ["erp-sync-queue"]) == {"erp-sync-queue": 0}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    backlogs=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=8),
    weights=st.lists(st.integers(min_value=1, max_value=4), min_size=8, max_size=8),
)
def test_every_tenant_gets_its_weighted_share_of_each_stretch_of_picks(redis_db, backlogs, weights):
    redis_db.flushdb()
    with redis_db.pipeline() as pipe:
        for org, n in enumerate(backlogs):
            fairshare.set_weight(redis_db, org, weights[org])
            for i in range(n):
                fairshare.push(pipe, queue=QUEUE, tenant=str(org), job_id=f"{org}-{i}")
                pipe.hset(f"rq:job:{org}-{i}", "status", "queued")
        pipe.execute()
    served: list[int] = []
    while (picked := fairshare.pick(redis_db, [QUEUE])) is not None:
        served.append(int(picked[2]))
    # Nothing lost, nothing twice, each tenant's jobs in their order.
    assert sorted(served) == sorted(org for org, n in enumerate(backlogs) for _ in range(n))
    picked_ids = [i.decode() for i in redis_db.lrange(f"rq:queue:{QUEUE}:intermediate", 0, -1)]
    for org, n in enumerate(backlogs):
        assert [i for i in picked_ids if i.split("-")[0] == str(org)] == [f"{org}-{i}" for i in range(n)]
    # While two tenants both still have work, neither is more than one turn (of its weight) ahead.
    done = dict.fromkeys(range(len(backlogs)), 0)
    for org in served:
        done[org] += 1
        busy = [o for o in done if done[o] < backlogs[o]]
        for a in busy:
            for b in busy:
                assert done[a] / weights[a] - done[b] / weights[b] <= 1 + 1e-9


def test_queue_stats_json_keeps_its_keys_and_adds_each_fair_queues_tenants():
    import json
    from io import StringIO

    from django.core.management import call_command

    _flood(1, 30)
    _flood(2, 5)
    out = StringIO()
    call_command("queue_stats", "--json", stdout=out)
    data = json.loads(out.getvalue())
    p3 = data[QUEUE]
    assert {k: p3[k] for k in ("waiting", "active", "failed", "completed", "delayed")} == {
        "waiting": 35,
        "active": 0,
        "failed": 0,
        "completed": 0,
        "delayed": 0,
    }
    assert p3["tenants"] == {
        "ready": 2,
        "tenants": [
            {"organization_id": 1, "waiting": 30, "share": 0.5},
            {"organization_id": 2, "waiting": 5, "share": 0.5},
        ],
        "other_waiting": 0,
    }
    assert "tenants" not in data["erp-sync-queue"]  # not a fair queue


def test_the_prometheus_tenant_gauge_keeps_its_label_cardinality_bounded():
    from crm.prometheus import TENANT_SERIES, PlatformCollector

    for org in range(TENANT_SERIES + 5):
        _flood(org + 1, org + 1)
    families = {f.name: f for f in PlatformCollector().collect()}
    samples = [s for s in families["crm_queue_tenant_waiting"].samples if s.labels["queue"] == QUEUE]
    assert len(samples) == TENANT_SERIES + 1
    by_org = {s.labels["organization"]: s.value for s in samples}
    assert by_org["15"] == 15 and by_org["6"] == 6 and by_org["other"] == 1 + 2 + 3 + 4 + 5
    ready = [s for s in families["crm_queue_tenants_ready"].samples if s.labels["queue"] == QUEUE]
    assert ready[0].value == TENANT_SERIES + 5


def test_the_queue_pages_list_cancel_and_empty_the_jobs_waiting_in_tenants_lists(redis_db):
    from crm import queue_actions, queue_ops

    ids = jobs.enqueue_many(
        "tests.jobs.record",
        queue=QUEUE,
        kwargs_list=[{"key": "order", "value": str(i)} for i in range(4)],
        job_ids=[f"fair-{i}" for i in range(4)],
        organization_id=9,
    )
    page = queue_ops.list_jobs(QUEUE, "waiting")
    assert sorted(r.id for r in page.rows) == ids
    assert queue_actions.state_sizes(QUEUE)["waiting"] == 4
    assert queue_actions.job_cancel("fair-1") == QUEUE
    assert queue_actions.state_sizes(QUEUE)["waiting"] == 3
    assert queue_actions.bulk_run(QUEUE, "empty") == 3
    assert queue_actions.state_sizes(QUEUE)["waiting"] == 0
    assert not any(redis_db.exists(f"rq:job:fair-{i}") for i in (0, 2, 3))
    _worker_run([QUEUE])
    assert recorded("order") == []  # nothing canceled or emptied ran


def _picked_tenants(connection, n: int) -> list[str | None]:
    picks = [fairshare.pick(connection, [QUEUE]) for _ in range(n)]
    return [p[2] if p else None for p in picks]


def test_a_parked_tenant_is_not_picked_until_its_time_then_rejoins_in_turn(redis_db):
    _flood(1, 3)
    _flood(2, 2)
    picked = fairshare.pick(redis_db, [QUEUE])  # tenant 1's first job (tied with 2, named first)
    assert picked is not None and picked[2] == "1"
    job_id = picked[1]
    # Its job meets the tenant's limit: back at the head of its list, the tenant parked.
    redis_db.lrem(f"rq:queue:{QUEUE}:intermediate", 1, job_id)
    fairshare.park(redis_db, queue=QUEUE, tenant="1", job_id=job_id, until=time.time() + 3600)
    _flood(1, 1)  # work arriving for a parked tenant waits in its list, the tenant still parked
    assert _picked_tenants(redis_db, 3) == ["2", "2", None]
    # Still counted and listed while parked (queue pages, queue_stats).
    assert fairshare.waiting(redis_db, [QUEUE]) == {QUEUE: 4}
    assert fairshare.queued_ids(redis_db, QUEUE)[0] == job_id
    assert fairshare.tenant_counts(redis_db, QUEUE) == [("1", 4)]
    assert fairshare.parked_waiting(redis_db, [QUEUE]) == 4
    assert QUEUE in stats.oldest_waiting()  # /healthz and the gauges see the parked tenant's jobs
    # Its time comes: the next pick re-admits it, and the job it put back comes first.
    redis_db.zadd(fairshare.parked_key(QUEUE), {"1": time.time() - 1})
    picked = fairshare.pick(redis_db, [QUEUE])
    assert picked is not None and picked[1] == job_id
    assert redis_db.zcard(fairshare.parked_key(QUEUE)) == 0
    assert _picked_tenants(redis_db, 4) == ["1", "1", "1", None]


def test_a_waiting_worker_picks_a_parked_tenants_job_when_its_time_comes_without_a_wake_signal(redis_db):
    _flood(5, 1)
    picked = fairshare.pick(redis_db, [QUEUE])
    assert picked is not None
    redis_db.lrem(f"rq:queue:{QUEUE}:intermediate", 1, picked[1])
    redis_db.delete(fairshare.wake_key(QUEUE))
    fairshare.park(redis_db, queue=QUEUE, tenant="5", job_id=picked[1], until=time.time() + 1)
    queue = jobs.get_queue(QUEUE)
    got = fairshare.FairQueue.dequeue_any([queue], timeout=60, connection=redis_db)
    assert got is not None and got[0].id == picked[1]


def test_emptying_a_parked_tenants_list_takes_it_out_of_the_parked_set(redis_db):
    ids = jobs.enqueue_many(
        "tests.jobs.record", queue=QUEUE, kwargs_list=[{"key": "order", "value": "x"}], organization_id=3
    )
    picked = fairshare.pick(redis_db, [QUEUE])
    assert picked is not None and picked[1] == ids[0]
    redis_db.lrem(f"rq:queue:{QUEUE}:intermediate", 1, ids[0])
    fairshare.park(redis_db, queue=QUEUE, tenant="3", job_id=ids[0], until=time.time() + 3600)
    job = jobs.fetch_job(ids[0])
    assert job is not None and fairshare.remove(redis_db, QUEUE, job)
    assert redis_db.zcard(fairshare.parked_key(QUEUE)) == 0
    assert fairshare.waiting(redis_db, [QUEUE]) == {QUEUE: 0}
