"""The operator's day in a real browser, against the stack `manage.py up` runs: log in, create a
WhatsApp campaign against the Meta sandbox, start it and watch the progress reach 100%; open the
queue pages and retry a failed job; pause and resume a runner handler; read the metrics JSON. A
non-staff user is refused every queue page and action. The demo organization's manager sees its
campaigns only and is refused the platform's pages. Screenshots go to var/screenshots/."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import Page, expect

from crm import jobs, queues, stats
from tests.browser.conftest import (
    CLERK_PASSWORD,
    CLERK_USERNAME,
    DEMO_CUSTOMERS,
    MANAGER_PASSWORD,
    MANAGER_USERNAME,
    STAFF_PASSWORD,
    STAFF_USERNAME,
    Stack,
    log_in,
    screenshot,
)
from tests.conftest import recorded, wait_for
from tests.jobs import release

pytestmark = pytest.mark.slow


def _status(job_id: str) -> str | None:
    job = jobs.fetch_job(job_id)
    status = None if job is None else job.get_status(refresh=True)
    return None if status is None else str(getattr(status, "value", status))


def _path(url: str) -> str:
    return urlparse(url).path


def _select_and_run(page: Page, pk: int, action: str) -> None:
    """Tick one row of a changelist, choose the action and press the action button ("Go")."""
    page.check(f"#result_list input[name=_selected_action][value='{pk}']")
    page.select_option("select[name=action]", action)
    with page.expect_navigation():
        page.click("button[name=index]")


def _campaign_reaches_100_percent(page: Page, stack: Stack) -> None:
    from campaigns import selectors
    from campaigns.models import Campaign
    from integrations.models import WhatsappNumber, WhatsappTemplate

    log_in(page, STAFF_USERNAME, STAFF_PASSWORD, shot="login")
    assert _path(page.url) == "/admin/"

    org_id = stack.ids["organization"]
    numbers = WhatsappNumber.objects.filter(organization_id=org_id).order_by("pk")  # store 001's first
    number_id = stack.orm.run(lambda: numbers.values_list("pk", flat=True).first())
    # The demo's templates are synced from the Meta sandbox (a job once it answers): pick one.
    synced = WhatsappTemplate.objects.filter(organization_id=org_id, name="promo_demo")
    wait_for(lambda: stack.orm.run(synced.exists), timeout=180, what="the demo's templates synced")
    template_id = stack.orm.run(lambda: synced.values_list("pk", flat=True).first())
    page.goto(f"/admin/campaigns/campaign/add/?organization={org_id}")
    page.select_option("select[name=organization]", str(org_id))
    page.fill("input[name=name]", "Ofertas de inverno")
    page.select_option("select[name=channel]", "whatsapp")
    page.select_option("select[name=whatsapp_number]", str(number_id))
    page.select_option("select[name=whatsapp_template]", str(template_id))
    page.select_option("select[name=template_variables_0]", "first_name")
    page.select_option("select[name=template_variables_1]", "store_name")
    page.fill("input[name=header_image_url]", "https://loja.example.com.br/inverno.jpg")
    with page.expect_navigation():
        page.click("input[name=_save]")
    assert _path(page.url) == "/admin/campaigns/campaign/"
    pk, status = stack.orm.run(
        lambda: Campaign.objects.values_list("pk", "status").get(name="Ofertas de inverno")
    )
    assert status == Campaign.Status.DRAFT

    _select_and_run(page, pk, "start")
    expect(page.locator(".messagelist .success")).to_be_visible()
    assert stack.orm.run(lambda: Campaign.objects.get(pk=pk).status) in ("sending", "sent")

    # The change page polls <pk>/status/ and moves the bar itself: no reload.
    page.goto(f"/admin/campaigns/campaign/{pk}/change/")
    progress = page.locator("#live-status [data-field=progress]")
    expect(progress).to_have_text(re.compile(r"^100([.,]0)?%$"), timeout=180_000)
    assert page.locator("#live-status progress").evaluate("bar => bar.value") == 1
    # The charts are drawn in the browser (uPlot) from the series JSON.
    expect(page.locator("#campaign-chart-events canvas")).to_have_count(1)
    expect(page.locator("#campaign-chart-cost canvas")).to_have_count(1)
    screenshot(page, "campaign-change-100")

    campaign = stack.orm.run(lambda: Campaign.objects.get(pk=pk))
    data = stack.orm.run(selectors.campaign_status, campaign=campaign)
    assert data["total"] == DEMO_CUSTOMERS
    assert data["counts"]["sent"] + data["counts"]["delivered"] + data["counts"]["read"] == DEMO_CUSTOMERS

    page.goto("/admin/campaigns/campaign/")
    row = page.locator(f"#result_list tr:has(input[name=_selected_action][value='{pk}'])")
    expect(row.locator("td.field-progress")).to_have_text(
        re.compile(rf"^{DEMO_CUSTOMERS}/{DEMO_CUSTOMERS} .*\(100%\) · {DEMO_CUSTOMERS} ")
    )
    screenshot(page, "campaign-list")

    page.goto(f"/admin/crm/organization/{campaign.organization_id}/dashboard/")
    expect(page.locator("body")).to_contain_text("Ofertas de inverno")  # among the last 30 days' campaigns
    screenshot(page, "organization-dashboard")


def _failed_job_is_retried_from_the_queue_pages(page: Page, stack: Stack) -> None:
    job_id = "browser-fail-once"
    # `maintenance` has one attempt: the first failure is final until someone retries it.
    stack.orm.run(
        jobs.enqueue,
        "tests.jobs.fails_first_run",
        queue="maintenance",
        kwargs={"key": job_id, "message": "failing the first time on purpose"},
        job_id=job_id,
    )
    wait_for(lambda: _status(job_id) == "failed", timeout=120, what="the worker to fail the job")

    log_in(page, STAFF_USERNAME, STAFF_PASSWORD)
    page.goto("/admin/queues/")
    failed = page.locator("#queue-maintenance td.failed")
    assert int(re.sub(r"\D", "", failed.inner_text())) >= 1
    screenshot(page, "queue-overview")

    with page.expect_navigation():
        failed.locator("a").first.click()
    assert _path(page.url) == "/admin/queues/maintenance/failed/"
    screenshot(page, "failed-list")
    with page.expect_navigation():
        page.locator(f'tr.job[data-job-id="{job_id}"] a[href*="/admin/queues/jobs/"]').first.click()
    assert _path(page.url) == f"/admin/queues/jobs/{job_id}/"
    expect(page.locator("body")).to_contain_text("failing the first time on purpose")  # the traceback
    screenshot(page, "failed-job")

    with page.expect_navigation():
        page.click("button[name=action][value=retry]")
    expect(page.locator(".messagelist .success")).to_be_visible()
    wait_for(lambda: _status(job_id) == "finished", timeout=120, what="the retried job to succeed")
    assert jobs.get_connection().llen(f"crm:test:{job_id}") == 2  # failed once, then succeeded
    page.goto(f"/admin/queues/jobs/{job_id}/")
    expect(page.locator("button[name=action][value=retry]")).to_have_count(0)  # nothing left to retry

    page.goto("/admin/schedules/")
    expect(page.locator("body")).to_contain_text("recover")  # a cron entry with its next run
    screenshot(page, "schedules")


def _handler_is_paused_and_resumed(page: Page, stack: Stack) -> None:
    from runner.models import Handler

    handler_id = stack.ids["handler"]
    log_in(page, STAFF_USERNAME, STAFF_PASSWORD)
    for action, paused in (("pause", True), ("resume", False)):
        page.goto("/admin/runner/handler/")
        _select_and_run(page, handler_id, action)
        expect(page.locator(".messagelist .success")).to_be_visible()
        row = page.locator(f"#result_list tr:has(input[name=_selected_action][value='{handler_id}'])")
        expect(row.locator("td.field-paused img")).to_have_attribute("alt", str(paused))
        assert stack.orm.run(lambda: Handler.objects.get(pk=handler_id).paused) is paused
        if paused:
            screenshot(page, "handler-list")
    page.goto("/admin/runner/dashboard/")
    expect(page.locator(f"#handler-{handler_id}")).to_be_visible()
    screenshot(page, "runner-dashboard")


def _metrics_json_counts_every_queue(page: Page, stack: Stack) -> None:
    stack.orm.run(
        jobs.enqueue, "tests.jobs.record", queue="chatwoot-inbound", kwargs={"key": "m", "value": "1"}
    )
    stack.orm.run(
        jobs.enqueue,
        "tests.jobs.record",
        queue="post-sale-survey",
        kwargs={"key": "m", "value": "2"},
        delay=600,
    )
    wait_for(lambda: recorded("m") == ["1"], timeout=120, what="the worker to run the job")

    log_in(page, STAFF_USERNAME, STAFF_PASSWORD)
    response = page.goto("/admin/metrics")
    assert response is not None and response.status == 200
    assert response.headers["content-type"].startswith("application/json")
    data = json.loads(page.locator("pre").first.inner_text())  # what the browser shows
    assert list(data) == list(queues.QUEUE_NAMES)
    for name, counts in data.items():
        assert set(counts) == set(stats.STATES), name
        assert all(isinstance(v, int) and v >= 0 for v in counts.values()), name
    assert data["chatwoot-inbound"]["completed"] >= 1
    assert data["post-sale-survey"]["delayed"] >= 1
    # For a readable screenshot: Chromium's JSON viewer has a "Pretty-print" box at the top left,
    # outside the page's DOM (if a version moves it, the click misses and nothing else changes).
    page.mouse.click(104, 9)
    screenshot(page, "metrics")


def _log_in_as_clerk(page: Page, stack: Stack) -> None:
    """The admin's own form refuses a non-staff user, so the session is made by Django's test
    client and handed to the browser as its cookie; from then on every request is the browser's."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    log_in(page, CLERK_USERNAME, CLERK_PASSWORD)
    assert _path(page.url) == "/admin/login/"
    expect(page.locator(".errornote")).to_be_visible()

    def _session() -> str:
        client = Client()
        client.force_login(get_user_model().objects.get(username=CLERK_USERNAME))
        return client.cookies["sessionid"].value

    page.context.add_cookies([{"name": "sessionid", "value": stack.orm.run(_session), "url": stack.base}])


def _queue_state(ids: dict[str, str]) -> dict[str, Any]:
    connection = jobs.get_connection()
    waiting = [
        i.decode() if isinstance(i, bytes) else i for i in connection.lrange("rq:queue:maintenance", 0, -1)
    ]
    return {
        "statuses": {name: _status(job_id) for name, job_id in ids.items()},
        "failed": connection.zscore("rq:failed:maintenance", ids["failed"]) is not None,
        "scheduled": connection.zscore("rq:scheduled:maintenance", ids["delayed"]) is not None,
        "waiting": [ids["waiting"] in waiting, ids["waiting2"] in waiting],
    }


def _non_staff_user_is_refused_every_queue_page_and_action(page: Page, stack: Stack) -> None:
    ids = {
        "failed": "browser-always-fails",
        "waiting": "browser-waiting-1",
        "waiting2": "browser-waiting-2",
        "delayed": "browser-delayed",
    }
    run = stack.orm.run
    run(jobs.enqueue, "tests.jobs.fail", queue="maintenance", kwargs={"key": "nf"}, job_id=ids["failed"])
    wait_for(lambda: _status(ids["failed"]) == "failed", timeout=120, what="the worker to fail the job")
    # Hold the only worker busy (until released below) so the next jobs stay waiting while the clerk
    # tries to touch them.
    run(jobs.enqueue, "tests.jobs.hold", queue="items-p1", kwargs={"key": "busy"})
    wait_for(lambda: recorded("busy"), timeout=120, what="the worker to start the held job")
    for name in ("waiting", "waiting2"):
        run(
            jobs.enqueue,
            "tests.jobs.record",
            queue="maintenance",
            kwargs={"key": name, "value": "ran"},
            job_id=ids[name],
        )
    run(
        jobs.enqueue,
        "tests.jobs.record",
        queue="maintenance",
        kwargs={"key": "delayed", "value": "ran"},
        job_id=ids["delayed"],
        delay=600,
    )
    before = _queue_state(ids)
    assert before == {
        "statuses": {"failed": "failed", "waiting": "queued", "waiting2": "queued", "delayed": "scheduled"},
        "failed": True,
        "scheduled": True,
        "waiting": [True, True],
    }

    _log_in_as_clerk(page, stack)
    pages = [
        "/admin/queues/",
        "/admin/queues/maintenance/failed/",
        "/admin/queues/maintenance/waiting/",
        f"/admin/queues/jobs/{ids['failed']}/",
        "/admin/queues/maintenance/waiting/empty/",
        "/admin/metrics",
    ]
    for url in pages:
        page.goto(url)
        assert _path(page.url) == "/admin/login/", url
        assert parse_qs(urlparse(page.url).query)["next"] == [url]
        # "You are authenticated as vendedora, but are not authorized to access this page."
        expect(page.locator(".errornote")).to_contain_text(CLERK_USERNAME)
        if url == "/admin/queues/":
            screenshot(page, "refusal")

    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    actions = [
        f"/admin/queues/jobs/{ids['failed']}/retry/",
        f"/admin/queues/jobs/{ids['failed']}/delete/",
        f"/admin/queues/jobs/{ids['delayed']}/promote/",
        f"/admin/queues/jobs/{ids['waiting']}/cancel/",
        f"/admin/queues/jobs/{ids['waiting2']}/delete/",
        "/admin/queues/maintenance/waiting/empty/",
        "/admin/queues/maintenance/failed/retry-all/",
        "/admin/queues/maintenance/failed/delete-all/",
        "/admin/queues/maintenance/delayed/promote-all/",
    ]
    for url in actions:
        response = page.request.post(stack.url(url), headers={"X-CSRFToken": token}, form={"confirm": "1"})
        # Past the CSRF check (not a 403) and sent to the login page by the admin.
        assert response.ok, (url, response.status)
        assert _path(response.url) == "/admin/login/", url

    after = _queue_state(ids)
    assert "finished" not in recorded("busy")  # taken while the worker was held
    assert after == before
    # They were really waiting: once the worker is free they run, as nothing happened to them.
    release("busy")
    wait_for(
        lambda: recorded("waiting") == ["ran"] and recorded("waiting2") == ["ran"],
        timeout=120,
        what="the waiting jobs to run after the held one",
    )
    assert _status(ids["failed"]) == "failed" and recorded("delayed") == []


def _other_organization_campaign() -> int:
    from campaigns.models import Campaign
    from crm.models import Organization

    other = Organization.objects.create(name="Outra Loja", slug="outra-loja")
    return Campaign.objects.create(organization=other, name="Campanha secreta da outra loja").pk


def _manager_sees_only_the_demo_organization(page: Page, stack: Stack) -> None:
    """The login `up`'s demo printed: the demo's campaigns, not another organization's; no queue
    pages, schedules or metrics (403), and no links to them."""
    secret = stack.orm.run(_other_organization_campaign)
    log_in(page, MANAGER_USERNAME, MANAGER_PASSWORD)
    assert _path(page.url) == "/admin/", page.url
    expect(page.locator("#operations")).to_have_count(0)
    expect(page.locator("#content-main")).to_contain_text("Campa")  # campaigns, in either language
    screenshot(page, "manager-index")
    page.goto("/admin/campaigns/campaign/")
    expect(page.locator("#content-main")).not_to_contain_text("secreta")
    screenshot(page, "manager-campaigns")
    for url, status in (
        (f"/admin/campaigns/campaign/{secret}/change/", 404),
        (f"/admin/campaigns/campaign/{secret}/status/", 404),
        ("/admin/queues/", 403),
        ("/admin/schedules/", 403),
        ("/admin/metrics", 403),
        ("/admin/rq/", 403),
    ):
        response = page.goto(url)
        assert response is not None and response.status == status, (url, response and response.status)


STEPS = [
    ("log in, create a WhatsApp campaign, start it, watch it reach 100%", _campaign_reaches_100_percent),
    ("open the queue pages, retry a failed job", _failed_job_is_retried_from_the_queue_pages),
    ("pause and resume a runner handler", _handler_is_paused_and_resumed),
    ("read the metrics JSON", _metrics_json_counts_every_queue),
    (
        "a non-staff user is refused every queue page and action",
        _non_staff_user_is_refused_every_queue_page_and_action,
    ),
    ("the demo's manager sees only the demo organization", _manager_sees_only_the_demo_organization),
]


def test_the_operator_journey_in_a_browser(
    stack: Stack, new_page: Callable[[], Page], subtests: pytest.Subtests
) -> None:
    """One stack for every step (starting it is most of the time); each step is reported on its own
    and runs in a fresh browser session, whether the step before passed or not."""
    for title, step in STEPS:
        with subtests.test(msg=title):
            step(new_page(), stack)
