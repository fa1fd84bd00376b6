"""A retired queue (crm.queues.RETIRED) loses none of the jobs an upgrade finds on it: the recovery
pass moves the waiting and delayed ones onto its successor, where they run. Real Redis and RQ."""

from __future__ import annotations

from datetime import timedelta

from rq import Queue
from rq.serializers import JSONSerializer

from crm import jobs, queues, recovery


def test_jobs_left_on_the_retired_chatwoot_mirror_queue_are_moved_and_run(db, run_jobs):
    assert queues.RETIRED == {"chatwoot-mirror": "chatwoot-inbound"}
    assert "chatwoot-mirror" not in queues.QUEUE_NAMES  # no worker listens to it
    connection = jobs.get_connection()
    old = Queue("chatwoot-mirror", connection=connection, serializer=JSONSerializer)
    old.enqueue("tests.jobs.record", kwargs={"key": "moved", "value": "waiting"}, meta={"organization_id": 3})
    old.enqueue_in(timedelta(seconds=30), "tests.jobs.record", kwargs={"key": "moved", "value": "delayed"})
    assert recovery.recover(dry_run=True) and old.count == 1  # a dry run moves nothing
    recovery.recover()
    keys = queues.redis_keys("chatwoot-mirror")
    assert not connection.llen(keys["waiting"]) and not connection.zcard(keys["scheduled"])
    run_jobs(["chatwoot-inbound"], settle=0)
    assert sorted(v.decode() for v in connection.lrange("crm:test:moved", 0, -1)) == ["delayed", "waiting"]
    recovery.recover()  # twice: nothing left to move, nothing runs twice
    run_jobs(["chatwoot-inbound"], settle=0)
    assert connection.llen("crm:test:moved") == 2
