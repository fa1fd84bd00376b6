from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from crm import jobs
from runner.models import Execution, ExecutionItem, Handler


@pytest.fixture
def staff_client(client, transactional_db):
    user = User.objects.create_superuser("op", "op@example.com.br", "pw")
    client.force_login(user)
    return client


def test_runner_run_starts_a_manual_execution_for_the_handlers_organization(py_handler, org, run_jobs):
    out = io.StringIO()
    call_command("runner_run", "crm-x", "leads", stdout=out)
    execution = Execution.objects.get(pk=int(out.getvalue()))
    assert (execution.trigger, execution.organization_id) == ("manual", org.pk)
    run_jobs()
    execution.refresh_from_db()
    assert execution.status == "completed"
    with pytest.raises(CommandError, match=r"^não há rotina crm-x/nope \(rotinas: crm-x/leads\)$"):
        call_command("runner_run", "crm-x", "nope")
    with pytest.raises(CommandError, match=r"^não há organização 'nope' \(organizações: runner-org\)$"):
        call_command("runner_run", "crm-x", "leads", "--org", "nope")
    with pytest.raises(CommandError, match=r"^não há rotina foo/bar \(rotinas: crm-x/leads\)$"):
        call_command("dlq_replay", "--handler", "foo/bar")
    with pytest.raises(CommandError, match=r"^--handler 'foo': use INTEGRATION_KEY/HANDLER_KEY$"):
        call_command("dlq_replay", "--handler", "foo")


def test_the_admin_shows_the_dlq_and_replays_selected_items(staff_client, py_handler, org, run_jobs):
    jobs.get_connection().sadd("runner:test:reject", "e1")
    call_command("runner_run", "crm-x", "leads", stdout=io.StringIO())
    run_jobs()
    item = ExecutionItem.objects.get(external_id="e1")
    page = staff_client.get("/admin/runner/executionitem/?dlq=1")
    assert page.status_code == 200 and b"rejected for good" in page.content
    assert staff_client.get("/admin/runner/handler/").status_code == 200
    assert staff_client.get("/admin/runner/integrationtype/").status_code == 200
    assert staff_client.get("/admin/runner/execution/").status_code == 200
    jobs.get_connection().delete("runner:test:reject")
    staff_client.post(
        "/admin/runner/executionitem/", {"action": "replay", "_selected_action": [item.pk]}, follow=True
    )
    run_jobs()
    item.refresh_from_db()
    assert (item.status, item.dlq_at) == ("succeeded", None)


def test_the_admin_pauses_a_handler_and_stores_its_secrets_encrypted(staff_client, py_handler):
    staff_client.post("/admin/runner/handler/", {"action": "pause", "_selected_action": [py_handler.pk]})
    py_handler.refresh_from_db()
    assert py_handler.paused
    form = staff_client.get(f"/admin/runner/handler/{py_handler.pk}/change/")
    assert form.status_code == 200
    data = {
        "integration": py_handler.integration_id,
        "handler_key": "leads",
        "direction": "inbound",
        "kind": "python",
        "callable_path": "tests.runner.handlers",
        "endpoint_url": "",
        "auth_header": "Authorization",
        "auth_value": "",
        "organization": py_handler.organization_id,
        "concurrency": 5,
        "rate_limit_per_minute": 0,
        "batch_size": 1,
        "schedule_cron": "",
        "webhook_auth": "token",
        "webhook_secret": "tok-123456",
    }
    response = staff_client.post(f"/admin/runner/handler/{py_handler.pk}/change/", data)
    assert response.status_code == 302
    h = Handler.objects.get(pk=py_handler.pk)
    assert h.webhook_secret() == "tok-123456" and "tok-123456" not in h.webhook_secret_encrypted
