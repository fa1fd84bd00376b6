"""The demo's integration as a new user meets it: `manage.py demo` creates it and prints how to
start it; the manual run and the printed curl line complete on the production paths."""

from __future__ import annotations

import json
import shlex
import subprocess
from io import StringIO

import phonenumbers
import pytest
from django.core.management import call_command
from django.urls import reverse

from crm.models import Customer, Organization
from runner import demo
from runner.models import Execution, ExecutionItem, Handler, IntegrationType

pytestmark = pytest.mark.django_db(transaction=True)


def _demo(**options: str) -> str:
    out = StringIO()
    call_command("demo", customers=3, stdout=out, **options)
    return out.getvalue()


def _curl(output: str) -> list[str]:
    """The webhook's curl line `demo` printed, as argv."""
    line = next(line for line in output.splitlines() if "curl " in line)
    return shlex.split(line.split("webhook:", 1)[1])


def _status(argv: list[str]) -> str:
    """Run a curl command line; returns the HTTP status it got."""
    done = subprocess.run(
        [*argv, "-sS", "-o", "/dev/null", "-w", "%{http_code}"], capture_output=True, text=True, timeout=30
    )
    return done.stdout


def _run(worker_process) -> Execution:
    out = StringIO()
    call_command("runner_run", demo.INTEGRATION_KEY, demo.HANDLER_KEY, "--org", "demo", stdout=out)
    assert worker_process("--burst").wait(timeout=180) == 0
    return Execution.objects.get(pk=int(out.getvalue()))


def test_demo_creates_the_integration_once_and_keeps_its_token():
    first = _demo()
    handler = Handler.objects.select_related("integration", "organization").get()
    token = handler.webhook_secret()
    assert (handler.integration.integration_key, handler.handler_key) == ("demo-shop", "signups")
    assert (handler.kind, handler.callable_path) == ("python", "runner.demo")
    assert handler.organization.slug == "demo"
    assert handler.webhook_auth == Handler.WebhookAuth.TOKEN and token.startswith("demo-")
    assert ".venv/bin/python manage.py runner_run demo-shop signups --org demo" in first
    assert f"Authorization: Bearer {token}" in first
    assert "http://127.0.0.1:8000/hooks/demo-shop/signups" in first  # PUBLIC_URL by default
    rows = list(Handler.objects.values()), list(IntegrationType.objects.values())

    assert _demo() == first
    assert (list(Handler.objects.values()), list(IntegrationType.objects.values())) == rows

    # An operator paused it and someone broke its path: the demo's settings come back, the pause
    # and the token stay.
    Handler.objects.update(callable_path="elsewhere", paused=True)
    _demo(public_url="http://crm.example.com.br:8001")
    handler.refresh_from_db()
    assert (handler.callable_path, handler.paused, handler.webhook_secret()) == ("runner.demo", True, token)


def test_a_manual_run_completes_through_a_worker_and_records_the_sign_ups(worker_process, admin_client):
    _demo()
    execution = _run(worker_process)
    assert (execution.status, execution.trigger, execution.items_total) == ("completed", "manual", 20)
    assert execution.items_succeeded == 20 and execution.items_failed == 0
    assert {i.result["customer"] for i in ExecutionItem.objects.filter(execution=execution)} == {"created"}
    org = Organization.objects.get(slug="demo")
    emails = [demo.signup(i)["email"] for i in range(demo.SIGNUPS)]
    signups = Customer.objects.filter(organization=org, email__in=emails)
    assert signups.count() == 20
    for customer in signups:
        assert phonenumbers.is_valid_number(phonenumbers.parse(customer.phone))  # E.164 from "(47) 9…"
    assert signups.filter(marketing_consent=True).exclude(consent_at=None).count() == 14
    for page in (reverse("admin:runner_dashboard"), f"/admin/runner/execution/{execution.pk}/change/"):
        response = admin_client.get(page)
        assert response.status_code == 200 and b"demo-shop" in response.content

    again = _run(worker_process)  # the same sign-ups: nothing new, nothing changed
    assert (again.status, again.items_succeeded) == ("completed", 20)
    assert {i.result["customer"] for i in ExecutionItem.objects.filter(execution=again)} == {"unchanged"}
    assert Customer.objects.filter(organization=org).count() == 3 + 20


def test_the_printed_curl_line_is_accepted_and_its_sign_up_becomes_a_customer(live_server, run_jobs):
    argv = _curl(_demo(public_url=live_server.url))
    done = subprocess.run([*argv, "-sS", "-w", "\n%{http_code}"], capture_output=True, text=True, timeout=30)
    body, status = done.stdout.rsplit("\n", 1)
    assert status == "202", done
    assert json.loads(body)["status"] == "accepted"
    run_jobs()  # drains the webhook inbox (the execution is created there), then runs the item
    execution = Execution.objects.get(pk=json.loads(body)["execution_id"])
    assert execution.trigger == "webhook"
    item = ExecutionItem.objects.get(execution=execution)
    customer = Customer.objects.get(organization__slug="demo", email="ana.souza@example.com.br")
    assert (item.status, item.external_id, item.result) == (
        "succeeded",
        "web-0001",
        {"customer_id": customer.pk, "customer": "created"},
    )
    assert (customer.name, customer.phone) == ("Ana Souza", "+5511987654321")  # from "(11) 98765-4321"
    assert customer.marketing_consent and customer.consent_at is not None

    # A wrong token is refused; a sign-up without a valid email fails for good (DLQ), nobody created.
    wrong = [a.replace("Bearer demo-", "Bearer nope-") for a in argv]
    assert _status(wrong) == "401"
    bad = [*argv[:-1], json.dumps({"id": "web-0002", "name": "Sem Email", "email": "not-an-email"})]
    assert _status(bad) == "202"
    run_jobs()
    failed = ExecutionItem.objects.get(external_id="web-0002")
    assert failed.status == "failed" and failed.dlq_at is not None and "no valid email" in failed.last_error
    assert not Customer.objects.filter(name="Sem Email").exists()
    assert Customer.objects.filter(organization__slug="demo").count() == 3 + 1
