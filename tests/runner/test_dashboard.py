from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from crm import jobs, resilience
from crm.models import Organization
from crm.resilience import Admission
from runner import cache, conf, executions, items, operator
from runner.models import Execution, Handler, IntegrationType, RunnerSettings

URL = "/admin/runner/integrationtype/dashboard/"


@pytest.fixture
def staff_client(client, transactional_db) -> Client:
    client.force_login(User.objects.create_superuser("op", "op@example.com.br", "pw"))
    return client


def _admit(handler: Handler, *, n: int = 1, tenant_limit: int = 1000, handler_limit: int = 0) -> Admission:
    admission = items.gate().admit(
        integration_key=handler.integration.integration_key,
        handler_id=handler.pk,
        organization_id=handler.organization_id or 0,
        n=n,
        tenant_limit=tenant_limit,
        handler_limit=handler_limit,
        concurrency=handler.concurrency,
        policy=conf.breaker_policy(),
    )
    assert admission.admitted
    return admission


def _fail(handler: Handler, times: int) -> None:
    """Calls that fail for the breaker, through the real Gate (as an item job reports them)."""
    for _ in range(times):
        items.gate().finish(
            _admit(handler),
            integration_key=handler.integration.integration_key,
            handler_id=handler.pk,
            outcome="failure",
            policy=conf.breaker_policy(),
        )


def _row(html: str, element_id: str) -> str:
    match = re.search(rf'<tr id="{element_id}".*?</tr>', html, re.S)
    assert match, f"no row {element_id}"
    return match.group(0)


def test_the_dashboard_is_linked_from_the_runner_changelists(staff_client, py_handler, english):
    assert reverse("admin:runner_dashboard") == URL
    for changelist in ("/admin/runner/handler/", "/admin/runner/integrationtype/"):
        assert f'href="{URL}"' in staff_client.get(changelist).content.decode()


def test_an_open_circuit_shows_the_seconds_until_half_open_and_reset_closes_it(
    staff_client, py_handler, integration, english
):
    _fail(py_handler, 2)
    row = _row(staff_client.get(URL).content.decode(), f"integration-{integration.pk}")
    assert 'data-state="closed"' in row and '<td class="num" data-field="failures">2</td>' in row

    _fail(py_handler, 3)  # the fifth consecutive failure opens it for RUNNER_BREAKER_OPEN_SECONDS (30)
    page = staff_client.get(URL)
    assert page.status_code == 200
    row = _row(page.content.decode(), f"integration-{integration.pk}")
    assert 'data-state="open"' in row
    seconds = int(re.search(r'data-open-for="(\d+)"', row).group(1))
    assert 0 < seconds <= 30  # counting down from 30 however long the page took
    assert f"open: half-open in {seconds} s" in row

    response = staff_client.post(reverse("admin:runner_dashboard_reset", args=[integration.pk]), follow=True)
    assert response.redirect_chain[0][0].startswith(URL)
    assert items.gate().breaker_state("crm-x")["state"] == "closed"
    assert "Circuit of crm-x closed." in response.content.decode()
    row = _row(response.content.decode(), f"integration-{integration.pk}")
    assert 'data-state="closed"' in row and 'data-field="failures">0<' in row


def test_the_integration_list_shows_each_circuit_read_in_one_round_trip(
    staff_client, py_handler, org, english, monkeypatch
):
    quiet = IntegrationType.objects.create(integration_key="erp-quiet", name="ERP quieto")
    shaky = IntegrationType.objects.create(integration_key="erp-shaky", name="ERP instavel")
    shaky_handler = Handler.objects.create(
        integration=shaky, handler_key="orders", direction="inbound", kind=Handler.Kind.PYTHON,
        callable_path="tests.runner.handlers", organization=org,
    )  # fmt: skip
    _fail(py_handler, 5)  # crm-x: open
    _fail(shaky_handler, 2)  # erp-shaky: closed, two failures counted

    reads: list[list[str]] = []

    def counted(connection, **kwargs):  # the real read, counted
        reads.append(kwargs["integration_keys"])
        return real_snapshot(connection, **kwargs)

    real_snapshot = resilience.snapshot
    monkeypatch.setattr(resilience, "snapshot", counted)
    html = staff_client.get("/admin/runner/integrationtype/").content.decode()
    cells = dict(
        re.findall(
            r'<th class="field-integration_key"><a [^>]*>([^<]+)</a></th>'
            r'.*?<td class="field-circuit">([^<]*)</td>',
            html,
            re.S,
        )
    )
    assert re.fullmatch(r"open \((29|30) s\)", cells["crm-x"]), cells
    assert cells["erp-shaky"] == "closed (2 ✗)"
    assert cells[quiet.integration_key] == "closed"
    assert [sorted(keys) for keys in reads] == [["crm-x", "erp-quiet", "erp-shaky"]]  # one read, not three


def test_the_handler_list_shows_leases_held_read_in_one_round_trip(
    staff_client, py_handler, org, monkeypatch
):
    idle = Handler.objects.create(
        integration=py_handler.integration, handler_key="idle", direction="inbound",
        kind=Handler.Kind.PYTHON, callable_path="tests.runner.handlers", organization=org,
    )  # fmt: skip
    for _ in range(3):  # three jobs of the handler admitted, each holding a lease
        _admit(py_handler)
    reads: list[list[int]] = []

    def counted(connection, **kwargs):  # the real read, counted
        reads.append(kwargs["handler_ids"])
        return real_snapshot(connection, **kwargs)

    real_snapshot = resilience.snapshot
    monkeypatch.setattr(resilience, "snapshot", counted)
    html = staff_client.get("/admin/runner/handler/").content.decode()
    cells = re.findall(r'<td class="field-in_flight">(\d+)</td>', html)
    assert sorted(cells) == ["0", "3"], cells
    assert [sorted(ids) for ids in reads] == [sorted([py_handler.pk, idle.pk])]  # one read, not two


def test_tenant_and_handler_windows_and_leases_show_what_was_admitted(staff_client, py_handler, org, english):
    RunnerSettings.objects.create(organization=org, rate_limit_per_minute=10)
    py_handler.rate_limit_per_minute = 20
    py_handler.save()
    other = Organization.objects.create(name="Loja Quieta", slug="quiet")
    Execution.objects.create(
        organization=other, integration=py_handler.integration, handler=py_handler, direction="inbound",
        trigger="webhook",
    )  # fmt: skip
    held = _admit(py_handler, n=7, tenant_limit=10, handler_limit=20)
    _admit(py_handler, n=1, tenant_limit=10, handler_limit=20)

    html = staff_client.get(URL).content.decode()
    tenant = _row(html, f"tenant-{org.pk}")
    assert 'data-used="8" data-limit="10"' in tenant and 'class="near-limit"' in tenant
    quiet = _row(html, f"tenant-{other.pk}")  # active (an execution today), nothing admitted, default limit
    assert 'data-used="0" data-limit="1000"' in quiet and "near-limit" not in quiet
    assert html.index(f'id="tenant-{org.pk}"') < html.index(f'id="tenant-{other.pk}"')  # busiest first
    handler = _row(html, f"handler-{py_handler.pk}")
    assert 'data-field="in-flight">2 / 10<' in handler
    assert 'data-field="rate">8 / 20<' in handler

    items.gate().finish(held, integration_key="crm-x", handler_id=py_handler.pk, outcome="success")
    handler = _row(staff_client.get(URL).content.decode(), f"handler-{py_handler.pk}")
    assert 'data-field="in-flight">1 / 10<' in handler  # the lease is released, the window still counts
    assert 'data-field="rate">8 / 20<' in handler


def test_executions_items_and_the_dlq_of_a_real_run(staff_client, py_handler, org, run_jobs, english):
    jobs.get_connection().set("runner:test:produce", 4)
    jobs.get_connection().sadd("runner:test:reject", "e1")
    execution = executions.execution_start(handler=py_handler, organization_id=org.pk, trigger="manual")
    run_jobs()
    execution.refresh_from_db()
    assert (execution.status, execution.items_succeeded, execution.items_failed) == ("completed", 3, 1)

    html = staff_client.get(URL).content.decode()
    row = _row(html, f"handler-{py_handler.pk}")
    assert 'data-field="executions">completed: 1<' in row
    counts = re.findall(r'<td class="num">(\d+)</td>', row)
    assert counts == ["0", "0", "3", "1", "0"]  # pending, running, succeeded, failed, cancelled
    assert "dlq=1" in row and re.search(r'data-field="dlq"><a [^>]*>1</a>', row)
    recent = _row(html, f"execution-{execution.pk}")
    assert reverse("admin:runner_execution_change", args=[execution.pk]) in recent
    assert 'data-status="completed"' in recent

    operator.items_replay(item_ids=operator.dlq_items(handler=py_handler))  # back to pending
    row = _row(staff_client.get(URL).content.decode(), f"handler-{py_handler.pk}")
    assert re.findall(r'<td class="num">(\d+)</td>', row) == ["1", "0", "3", "0", "0"]
    assert 'data-field="dlq">0<' in row


def test_pause_and_resume_flip_the_handler_and_its_cached_config_at_once(staff_client, py_handler, english):
    assert cache.load("crm-x", "leads", py_handler.organization_id)[1]["paused"] is False  # cached now
    html = staff_client.get(URL).content.decode()
    assert '<button type="submit" class="button" name="action" value="pause">' in _row(
        html, f"handler-{py_handler.pk}"
    )

    response = staff_client.post(reverse("admin:runner_dashboard_pause", args=[py_handler.pk]), follow=True)
    assert response.redirect_chain[0][0] == f"{URL}#handler-{py_handler.pk}"
    assert Handler.objects.get(pk=py_handler.pk).paused is True
    assert cache.load("crm-x", "leads", py_handler.organization_id)[1]["paused"] is True
    assert "Handler crm-x/leads paused." in response.content.decode()
    row = _row(response.content.decode(), f"handler-{py_handler.pk}")
    assert 'data-paused="1"' in row and 'name="action" value="resume"' in row

    staff_client.post(reverse("admin:runner_dashboard_resume", args=[py_handler.pk]))
    assert Handler.objects.get(pk=py_handler.pk).paused is False
    assert cache.load("crm-x", "leads", py_handler.organization_id)[1]["paused"] is False


def test_the_actions_take_posts_only_with_a_csrf_token(py_handler, transactional_db):
    user = User.objects.create_superuser("op", "op@example.com.br", "pw")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    pause = reverse("admin:runner_dashboard_pause", args=[py_handler.pk])
    assert strict.get(pause).status_code == 405
    assert strict.post(pause).status_code == 403
    assert Handler.objects.get(pk=py_handler.pk).paused is False


def test_anonymous_non_staff_and_staff_without_permissions_are_refused(py_handler, integration):
    _fail(py_handler, 5)
    anonymous = Client()
    member = Client()
    member.force_login(User.objects.create_user("ana", "ana@example.com.br", "pw"))  # not staff
    clerk = Client()
    clerk.force_login(User.objects.create_user("bia", "bia@example.com.br", "pw", is_staff=True))  # no perms
    pause = reverse("admin:runner_dashboard_pause", args=[py_handler.pk])
    reset = reverse("admin:runner_dashboard_reset", args=[integration.pk])
    for c in (anonymous, member):
        page = c.get(URL)
        assert page.status_code == 302 and page["Location"].startswith("/admin/login/")
        assert c.post(pause).status_code == 302
        assert c.post(reset).status_code == 302
    assert clerk.get(URL).status_code == 403
    assert clerk.post(pause).status_code == 404  # a member of no organization sees no handler
    assert clerk.post(reset).status_code == 403
    assert Handler.objects.get(pk=py_handler.pk).paused is False
    assert items.gate().breaker_state("crm-x")["state"] == "open"


def _handlers(n: int, org: Organization) -> None:
    integrations = IntegrationType.objects.bulk_create(
        [IntegrationType(integration_key=f"it-{i}", name=f"IT {i}") for i in range(n)]
    )
    handlers = Handler.objects.bulk_create(
        [
            Handler(integration=it, handler_key="h", direction="inbound", callable_path="x", organization=org)
            for it in integrations
        ]
    )
    Execution.objects.bulk_create(
        [
            Execution(
                organization=org,
                integration_id=h.integration_id,
                handler=h,
                direction="inbound",
                trigger="manual",
            )
            for h in handlers
            for _ in range(2)
        ]
    )


@pytest.mark.parametrize("n", [3, 30])
def test_the_page_costs_the_same_queries_for_3_or_30_handlers(
    staff_client, org, n, django_assert_max_num_queries
):
    _handlers(n, org)
    with django_assert_max_num_queries(10):
        html = staff_client.get(URL).content.decode()
    assert html.count('<tr id="handler-') == n and html.count('<tr id="integration-') == n
