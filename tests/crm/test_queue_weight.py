"""Organization.queue_weight feeds the fair queues' weights (kept in Redis from PostgreSQL, rebuilt
by `recover`), and operators see each fair queue's tenants and its oldest waiting job."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.urls import reverse

from crm import fairshare, jobs, stats, workers
from crm.models import Membership, Organization
from tests.conftest import recorded

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "items-p3"


def _flood(org: int, n: int) -> None:
    jobs.enqueue_many(
        "tests.jobs.record",
        queue=QUEUE,
        kwargs_list=[{"key": "order", "value": f"{org}:{i}"} for i in range(n)],
        organization_id=org,
    )


def _operator():
    return get_user_model().objects.create_user(
        "ops", password="pw-ops-123", is_staff=True, is_superuser=True
    )


def _org(slug: str, **fields) -> Organization:
    return Organization.objects.create(name=f"Loja {slug.title()}", slug=slug, **fields)


def test_an_organization_of_weight_two_gets_two_turns_for_every_one_of_weight_one():
    heavy, light = _org("pesada", queue_weight=2), _org("leve")
    _flood(heavy.pk, 40)
    _flood(light.pk, 40)
    workers.make_worker([QUEUE]).work(burst=True, max_jobs=30, logging_level="WARNING")
    order = [int(v.split(":")[0]) for v in recorded("order")]
    assert 19 <= order.count(heavy.pk) <= 21 and 9 <= order.count(light.pk) <= 11, order


def test_a_weight_changed_in_postgresql_reaches_redis_and_recover_rebuilds_them_after_a_flush(redis_db):
    heavy, back = _org("pesada", queue_weight=3), _org("volta", queue_weight=2)
    assert redis_db.hget(fairshare.WEIGHTS, str(heavy.pk)) == b"3"
    back.queue_weight = 1
    back.save()
    assert redis_db.hget(fairshare.WEIGHTS, str(back.pk)) is None  # 1 is the default: not kept
    redis_db.flushdb()
    redis_db.hset(fairshare.WEIGHTS, "999999", 5)  # a deleted organization's: dropped by the rebuild
    call_command("recover")
    assert redis_db.hgetall(fairshare.WEIGHTS) == {str(heavy.pk).encode(): b"3"}


def test_the_queue_page_lists_the_queues_tenants_with_their_waiting_jobs_and_share(client, english):
    big, small = _org("grande", queue_weight=3), _org("pequena")
    _flood(big.pk, 7)
    _flood(small.pk, 2)
    client.force_login(_operator())
    page = client.get(reverse("admin-queue-jobs", args=[QUEUE, "waiting"])).content.decode()
    table = page[page.index('id="queue-tenants"') : page.index("</table>", page.index('id="queue-tenants"'))]
    assert "2 organizations with jobs waiting" in table
    assert table.index("Loja Grande") < table.index("Loja Pequena")  # most waiting first
    for org, waiting, share in ((big, 7, "75%"), (small, 2, "25%")):
        row = table[table.index(f'data-organization-id="{org.pk}"') :]
        row = row[: row.index("</tr>")]
        assert f'<td class="waiting">{waiting}</td>' in row and f'<td class="share">{share}</td>' in row
    other = client.get(reverse("admin-queue-jobs", args=["erp-sync-queue", "waiting"])).content.decode()
    assert 'id="queue-tenants"' not in other  # not a fair queue


def test_the_oldest_waiting_job_is_seen_in_the_tenants_lists(client):
    assert QUEUE not in stats.oldest_waiting()
    _flood(_org("espera").pk, 3)
    assert stats.oldest_waiting()[QUEUE] >= 0
    health = client.get("/healthz").json()
    assert QUEUE in health["checks"]["oldest_waiting_seconds"]["by_queue"]


def test_only_platform_operators_edit_an_organizations_queue_weight(client, english):
    org = _org("pesos")
    client.force_login(_operator())
    page = client.get(reverse("admin:crm_organization_change", args=[org.pk])).content.decode()
    assert 'name="queue_weight"' in page
    manager = get_user_model().objects.create_user("gerente", password="pw-gerente-123", is_staff=True)
    Membership.objects.create(user=manager, organization=org, role="manager")
    client.force_login(manager)
    page = client.get(reverse("admin:crm_organization_change", args=[org.pk])).content.decode()
    assert 'name="name"' in page and 'name="queue_weight"' not in page  # shown, not editable
    assert "Queues" in page
