"""A flow's split holdout branch as its control arm: held-out customers recorded in the step
campaigns with their would-be send time, nothing sent on any channel, and the flow's lift report
(the campaigns' shape, from the same rollup and statistics) in `flows status --json` and on its
admin page. Real PostgreSQL, Redis, RQ workers, the WhatsApp and SMTP sandboxes."""

from __future__ import annotations

import json
from io import StringIO

from django.core.management import call_command

from campaigns import lift
from campaigns.models import Campaign, EmailMessage, WhatsappMessage
from crm import holdout
from crm.models import Customer
from flows import selectors, services
from flows.models import Enrollment, EnrollmentStep, Flow
from tests.campaigns.test_email_campaign import email_to_sandbox, smtp  # noqa: F401 - fixture

SPLIT_FLOW = {
    "key": "lift-split",
    "name": "Oferta com grupo de controle",
    "trigger": {"type": "whatsapp_reply", "keywords": ["oferta"]},
    "reentry": "once",
    "steps": [
        {
            "type": "split",
            "branches": [
                {"name": "treated", "percent": 60},
                {"name": "control", "percent": 40, "holdout": True},
            ],
        },
        {"type": "send_whatsapp", "template": "oferta", "variables": ["first_name"]},
        {
            "type": "send_email",
            "subject": "Oferta, {{ first_name }}",
            "body": "<p>Oi</p>",
            "body_format": "html",
        },
    ],
}
CAMPAIGN_LIFT_KEYS = {
    "treatment",
    "control",
    "buyers_rate_lift",
    "buyers_rate_lift_ci95",
    "p_value",
    "incremental_revenue",
    "significant",
    "revenue_per_customer_lift",
    "revenue_per_customer_lift_ci95",
    "revenue_per_customer_relative_lift",
    "revenue_p_value",
    "window_days",
}


def _status(flow) -> dict:
    out = StringIO()
    call_command("flows", "status", flow.key, "--org", flow.organization.slug, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_a_holdout_branch_is_the_flows_control_arm_and_receives_nothing_on_any_channel(
    wa,
    sandbox,
    smtp,  # noqa: F811
    sell,
    run_jobs,
    admin_client,
    english,
):
    org = wa["org"]
    org.block_multiple_campaigns = False  # two sends in a row: the caps aside, both arms alike
    org.save(update_fields=["block_multiple_campaigns"])
    email_to_sandbox(org, smtp)
    flow, _ = services.flow_import(data=SPLIT_FLOW, organization_slug=org.slug)
    people = wa["customers"](160)
    before = _status(flow)
    assert before["lift"] is not None  # a holdout branch: a control arm, empty so far
    assert before["lift"]["treatment"]["customers"] == before["lift"]["control"]["customers"] == 0
    services.enroll(flow=flow, customer_ids=[p.pk for p in people], entry_keys=[f"e{p.pk}" for p in people])
    run_jobs()

    enrollments = Enrollment.objects.filter(flow=flow)
    assert enrollments.filter(status="completed").count() == 160
    held = set(enrollments.filter(holdout=True).values_list("customer_id", flat=True))
    treated = set(enrollments.filter(holdout=False).values_list("customer_id", flat=True))
    assert 30 <= len(held) <= 100  # 40% of 160 drawn at random (±5 standard deviations)
    by_id = {p.pk: p for p in people}
    # Nothing reached a held-out customer, on either channel; every treated customer got both.
    phones = {m["to"] for m in sandbox.messages()}
    mailed = {r.lower() for m in smtp.messages() for r in m["rcpt_tos"]}
    assert not phones & {by_id[c].phone.lstrip("+") for c in held}
    assert not mailed & {by_id[c].email for c in held}
    assert phones == {by_id[c].phone.lstrip("+") for c in treated}
    assert mailed == {by_id[c].email for c in treated}
    # Each held-out customer is a held_out row of each step campaign, stamped at the would-be send.
    step_campaigns = Campaign.objects.filter(flow_step__flow=flow)
    assert {c.control_percent for c in step_campaigns} == {40}
    for model in (WhatsappMessage, EmailMessage):
        rows = model.objects.filter(campaign__in=step_campaigns, customer_id__in=held)
        assert set(rows.values_list("status", flat=True)) == {"held_out"}
        assert set(rows.values_list("customer_id", flat=True)) == held
        assert all(at is not None for at in rows.values_list("sent_at", flat=True))
    outcomes = EnrollmentStep.objects.filter(enrollment__holdout=True, index__in=[1, 2])
    assert set(outcomes.values_list("outcome", flat=True)) == {"holdout"}

    # Sales after the sends: each buyer's sale falls in both step campaigns' windows, and counts
    # once per arm in the flow's report.
    treated_buyers, held_buyers = sorted(treated)[:12], sorted(held)[:3]
    for customer_id in treated_buyers + held_buyers:
        sell(by_id[customer_id], "100.00")
    sell(by_id[treated_buyers[0]], "50.00")  # a second sale: one buyer, more revenue
    report = _status(flow)["lift"]
    assert set(report) == CAMPAIGN_LIFT_KEYS == set(lift.campaign_lift(campaign=step_campaigns[0]) or {})
    assert report["treatment"] == {"customers": len(treated), "buyers": 12, "revenue": "1250.00"}
    assert report["control"] == {"customers": len(held), "buyers": 3, "revenue": "300.00"}
    # The same statistics as a campaign's: the report of arms with these figures.
    arms = lift.pooled_arms(campaign_ids=[c.pk for c in step_campaigns])
    assert report == lift.lift_report(treatment=arms[0], control=arms[1], window_days=report["window_days"])
    low, high = report["buyers_rate_lift_ci95"]
    assert low < report["buyers_rate_lift"] < high and 0 <= report["p_value"] <= 1

    page = admin_client.get(f"/admin/flows/flow/{flow.pk}/change/").content.decode()
    assert 'id="flow-lift"' in page
    assert "attributed (last touch)" in page and "incremental" in page
    verdict = "Significant" if report["significant"] else "Not significant"
    assert verdict in page and ("this flow may have caused no sales at all" in page) != report["significant"]


def test_a_flow_without_a_holdout_branch_has_no_lift_and_no_control(
    wa, sandbox, run_jobs, admin_client, english
):
    data = {**SPLIT_FLOW, "steps": [SPLIT_FLOW["steps"][1]]}
    flow, _ = services.flow_import(data=data, organization_slug=wa["org"].slug)
    (ana,) = wa["customers"](1)
    services.enroll(flow=flow, customer_ids=[ana.pk], entry_keys=["a"])
    run_jobs()
    assert _status(flow)["lift"] is None
    assert Campaign.objects.get(flow_step__flow=flow).control_percent == 0
    page = admin_client.get(f"/admin/flows/flow/{flow.pk}/change/").content.decode()
    assert "No holdout branch" in page


def test_a_held_out_customer_the_send_would_skip_is_in_neither_arm(wa, sandbox, run_jobs, english):
    steps = [
        {"type": "split", "branches": [{"name": "control", "percent": 100, "holdout": True}]},
        SPLIT_FLOW["steps"][1],
    ]
    flow, _ = services.flow_import(data={**SPLIT_FLOW, "steps": steps}, organization_slug=wa["org"].slug)
    ana, bia = wa["customers"](2)
    Customer.objects.filter(pk=bia.pk).update(marketing_consent=False)  # her send would be skipped
    services.enroll(flow=flow, customer_ids=[ana.pk, bia.pk], entry_keys=["a", "b"])
    run_jobs()
    assert sandbox.messages() == []
    rows = WhatsappMessage.objects.filter(campaign__flow_step__flow=flow)
    assert list(rows.values_list("customer_id", "status")) == [(ana.pk, "held_out")]
    detail = EnrollmentStep.objects.get(enrollment__customer=bia, index=1).detail
    assert detail.startswith("split holdout (in neither arm")
    report = selectors.flow_lift(flow=flow)
    assert report is not None and report["control"]["customers"] == 1
    out = StringIO()
    call_command("flows", "status", flow.key, "--org", wa["org"].slug, stdout=out)
    assert "lift: buyers rate" in out.getvalue()  # the campaigns' line, in the text output too


def test_the_step_campaigns_control_share_is_the_holdout_branches():
    def share(*branches: tuple[int, bool]) -> int:
        split = [{"name": f"b{i}", "percent": p, "holdout": h} for i, (p, h) in enumerate(branches)]
        return Flow(steps=[{"type": "split", "branches": split}]).control_percent

    assert share((100, False)) == 0
    assert share((90, False), (10, True)) == 10
    assert share((20, False), (80, True)) == 50  # the campaigns' range
    assert Flow(steps=[{"type": "wait", "minutes": 1}]).control_percent == 0


def test_the_global_holdout_receives_no_marketing_flow_and_a_transactional_one_is_exempt(
    wa, sandbox, run_jobs
):
    org = wa["org"]
    holdout.holdout_set(organization=org, percent=15)
    people = wa["customers"](200)
    held = holdout.in_holdout(organization=org, customer_ids=[p.pk for p in people])
    assert 10 <= len(held) <= 55  # 15% of 200 (± 5 standard deviations)
    phones = {p.pk: p.phone.lstrip("+") for p in people}
    send = {**SPLIT_FLOW, "steps": [SPLIT_FLOW["steps"][1]]}
    marketing, _ = services.flow_import(data=send, organization_slug=org.slug)
    services.enroll(flow=marketing, customer_ids=list(phones), entry_keys=[f"m{c}" for c in phones])
    run_jobs()
    reached = {m["to"] for m in sandbox.messages()}
    assert reached == {phones[c] for c in phones if c not in held}  # nothing to the global holdout
    outcomes = EnrollmentStep.objects.filter(enrollment__flow=marketing, enrollment__customer_id__in=held)
    assert set(outcomes.values_list("outcome", "detail")) == {("holdout", "global holdout")}
    assert not WhatsappMessage.objects.filter(
        campaign__flow_step__flow=marketing, customer_id__in=held
    ).exists()

    receipt, _ = services.flow_import(
        data={**send, "key": "receipt", "transactional": True}, organization_slug=org.slug
    )
    services.enroll(flow=receipt, customer_ids=sorted(held), entry_keys=[f"t{c}" for c in sorted(held)])
    run_jobs()
    assert {phones[c] for c in held} <= {m["to"] for m in sandbox.messages()}  # exempt by its flag
