"""django-rq's dashboard under /admin/rq/ (crm.rq_dashboard): what is asked for and is not there
(a queue index past the queues, a worker that has stopped) is a 404, never a 500."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from rq.worker import Worker

from crm import jobs, queues


@pytest.fixture
def operator(db) -> Client:
    user = User.objects.create_user("opal", password="pw-opal-1234", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="operate_platform"))
    client = Client()
    client.force_login(user)
    return client


def test_a_stopped_workers_page_is_a_404_and_a_live_ones_is_shown(operator):
    queue = jobs.get_queue(queues.QUEUE_NAMES[0])
    live = Worker([queue], connection=jobs.get_connection(), name="alive")
    live.register_birth()
    gone = Worker([queue], connection=jobs.get_connection(), name="gone")
    gone.register_birth()
    jobs.get_connection().delete(gone.key)  # its key expired: the worker stopped without a word

    assert operator.get(f"/admin/rq/workers/0/{live.key}/").status_code == 200
    assert operator.get(f"/admin/rq/workers/0/{gone.key}/").status_code == 404
    assert operator.get("/admin/rq/workers/0/rq:worker:never-was/").status_code == 404


def test_a_queue_index_past_the_queues_is_a_404(operator):
    past = len(queues.QUEUE_NAMES) + 50
    assert operator.get("/admin/rq/queues/0/").status_code == 200
    for url in (f"/admin/rq/queues/{past}/", f"/admin/rq/workers/{past}/", f"/admin/rq/workers/{past}/x/"):
        assert operator.get(url).status_code == 404, url
