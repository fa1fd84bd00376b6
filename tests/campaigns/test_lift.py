"""Incrementality through the real stack: a campaign's control group drawn at fan-out (after the
caps), held out of every send (the Meta sandbox sees none of them), given the would-be send time;
the lift rollup kept as sales are written; `campaign_status --json`'s `lift`; the organization's
global holdout; per-channel windows and engagement-qualified attribution."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db.models import F
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from campaigns import attribution, lifecycle, lift, lift_pages, selectors
from campaigns.models import (
    Campaign,
    CampaignMetric,
    EmailMessage,
    LiftSale,
    SaleAttribution,
    WhatsappMessage,
)
from crm import holdout
from crm.models import Customer, HoldoutPeriod, Sale
from tests.campaigns.test_email_campaign import em, smtp  # noqa: F401 - fixtures

_numbers = iter(range(1, 10**9))


def _sale(store, customer: Customer | None, at, total: str = "100.00") -> Sale:
    return Sale.objects.create(
        organization_id=store.organization_id,
        store=store,
        customer=customer,
        erp_id=f"L{next(_numbers)}",
        total=Decimal(total),
        sold_at=at,
    )


def _status_text(campaign: Campaign) -> str:
    out = io.StringIO()
    call_command("campaign_status", str(campaign.pk), stdout=out)
    return out.getvalue()


def _status_json(campaign: Campaign) -> dict:
    out = io.StringIO()
    call_command("campaign_status", str(campaign.pk), "--json", stdout=out)
    return json.loads(out.getvalue())


def test_a_control_group_is_drawn_after_the_caps_and_receives_nothing(wa, sandbox, run_jobs):
    people = wa["customers"](400)
    # Ten customers were sent another campaign an hour ago: the 24-hour block skips them first.
    other = wa["campaign"](name="Earlier", status=Campaign.Status.SENT)
    for p in people[:10]:
        WhatsappMessage.objects.create(
            campaign=other,
            organization_id=p.organization_id,
            customer=p,
            status="sent",
            sent_at=timezone.now() - timedelta(hours=1),
        )
    campaign = lifecycle.campaign_start(campaign=wa["campaign"](control_percent=30))
    run_jobs()
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT
    rows = WhatsappMessage.objects.filter(campaign=campaign)
    held = set(rows.filter(status="held_out").values_list("customer_id", flat=True))
    sent = set(rows.filter(status="sent").values_list("customer_id", flat=True))
    skipped = set(rows.filter(status="skipped").values_list("customer_id", flat=True))
    assert skipped == {p.pk for p in people[:10]}  # capped before the split: in neither arm
    assert not held & skipped and len(held) + len(sent) == 390
    assert 70 <= len(held) <= 170  # 30% of 390 drawn at random (±5 standard deviations)
    phones = {p.pk: p.phone.lstrip("+") for p in people}
    received = {m["to"] for m in sandbox.messages()}
    assert received == {phones[c] for c in sent}
    assert not received & {phones[c] for c in held}
    # Their window starts when their batch was sent, never before the campaign started.
    stamps = rows.filter(status="held_out").values_list("sent_at", flat=True)
    assert all(at is not None and at >= campaign.started_at for at in stamps)
    data = _status_json(campaign)
    assert data["counts"]["held_out"] == len(held)
    assert data["counts"]["sent"] == len(sent)
    assert data["progress"] == 1.0
    assert CampaignMetric.objects.get(campaign=campaign).queued == len(sent) + len(skipped)  # what it sends
    lift_report = data["lift"]
    assert lift_report["treatment"] == {"customers": len(sent), "buyers": 0, "revenue": "0.00"}
    assert lift_report["control"] == {"customers": len(held), "buyers": 0, "revenue": "0.00"}


def test_without_a_control_group_the_lift_is_null_and_nothing_is_held_out(wa, run_jobs):
    wa["customers"](20)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    data = _status_json(campaign)
    assert data["lift"] is None
    assert data["counts"]["held_out"] == 0
    assert data["counts"]["sent"] == 20


def test_the_lift_report_follows_sales_as_they_are_written(wa, run_jobs):
    people = wa["customers"](120)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"](control_percent=50))
    run_jobs()
    # Sent ten days ago (a sale stamped in the future is never counted): both arms alike.
    WhatsappMessage.objects.filter(campaign=campaign).update(sent_at=F("sent_at") - timedelta(days=10))
    rows = {m.customer_id: m for m in WhatsappMessage.objects.filter(campaign=campaign)}
    store = wa["store"]
    by_arm: dict[bool, list[Customer]] = {True: [], False: []}
    for p in people:
        by_arm[rows[p.pk].status == "held_out"].append(p)
    treated, control = by_arm[False], by_arm[True]
    assert treated and control
    t0 = max(m.sent_at for m in rows.values())
    # Within the window: 2 sales of one treated customer, one of another, one of a control customer.
    _sale(store, treated[0], t0 + timedelta(hours=1), "50.00")
    _sale(store, treated[0], t0 + timedelta(days=2), "30.00")
    _sale(store, treated[1], t0 + timedelta(days=6), "20.00")
    held_sale = _sale(store, control[0], t0 + timedelta(days=1), "40.00")
    # Outside: before its message, after the 7-day window, no customer.
    _sale(store, treated[2], rows[treated[2].pk].sent_at - timedelta(minutes=5), "999.00")
    _sale(store, treated[3], t0 + timedelta(days=8), "999.00")
    _sale(store, None, t0 + timedelta(days=1), "999.00")
    report = _status_json(campaign)["lift"]
    assert report["treatment"] == {"customers": len(treated), "buyers": 2, "revenue": "100.00"}
    assert report["control"] == {"customers": len(control), "buyers": 1, "revenue": "40.00"}
    rate_t, rate_c = 2 / len(treated), 1 / len(control)
    assert report["buyers_rate_lift"] == pytest.approx(rate_t / rate_c - 1, abs=1e-5)
    low, high = report["buyers_rate_lift_ci95"]
    assert low < report["buyers_rate_lift"] < high and low < 0 < high  # a handful of sales: nothing shown
    assert report["significant"] is False and 0 < report["p_value"] <= 1
    per_customer = Decimal("100") / len(treated) - Decimal("40") / len(control)
    assert Decimal(report["incremental_revenue"]) == pytest.approx(
        per_customer * len(treated), abs=Decimal("0.02")
    )
    # A sale moved to another customer (the ERP corrected it) leaves the control arm.
    held_sale.customer = treated[4]
    held_sale.save()
    report = _status_json(campaign)["lift"]
    assert report["control"]["buyers"] == 0
    assert report["treatment"]["buyers"] == 3
    out = io.StringIO()
    call_command("campaign_status", str(campaign.pk), stdout=out)
    assert f"{report['incremental_revenue']}" in out.getvalue()  # the text form, in either language
    # Written again, nothing changes; rebuilt from scratch, the same figures.
    before = sorted(LiftSale.objects.values_list("campaign_id", "sale_id", "control", "total"))
    LiftSale.objects.all().delete()
    lift.campaign_lift_rebuild(campaign=campaign)
    assert sorted(LiftSale.objects.values_list("campaign_id", "sale_id", "control", "total")) == before


def test_a_held_out_row_is_recorded_once_and_counts_in_the_control_arm(wa):
    people = wa["customers"](2)
    campaign = wa["campaign"](control_percent=10, status=Campaign.Status.SENT)
    assert lift.held_out_record(campaign=campaign, customer_id=people[0].pk)
    assert not lift.held_out_record(campaign=campaign, customer_id=people[0].pk)
    _sale(wa["store"], people[0], timezone.now(), "10.00")
    report = lift.campaign_lift(campaign=campaign)
    assert report is not None
    assert report["control"] == {"customers": 1, "buyers": 1, "revenue": "10.00"}


def test_the_global_holdout_is_sticky_excluded_from_campaigns_and_reshuffled_with_history(wa):
    wa["customers"](2000)
    org = wa["org"]
    campaign = wa["campaign"]()
    everyone = set(selectors.campaign_audience(campaign=campaign).values_list("pk", flat=True))
    assert len(everyone) == 2000
    holdout.holdout_set(organization=org, percent=10)
    campaign.organization.refresh_from_db()
    audience = set(selectors.campaign_audience(campaign=campaign).values_list("pk", flat=True))
    held = holdout.in_holdout(organization=org, customer_ids=everyone)
    assert audience == everyone - held
    assert 120 <= len(held) <= 280  # 10% of 2000 (±5 standard deviations)
    assert selectors.campaign_audience_counts(campaign=campaign)["global_holdout"] == len(held)
    assert holdout.in_holdout(organization=org, customer_ids=everyone) == held  # sticky
    first = HoldoutPeriod.objects.get(organization=org)
    holdout.holdout_set(organization=org, percent=10, reshuffle=True)
    reshuffled = holdout.in_holdout(organization=org, customer_ids=everyone)
    assert reshuffled != held
    periods = list(HoldoutPeriod.objects.filter(organization=org).order_by("started_at"))
    assert periods[0].pk == first.pk and periods[0].ended_at is not None
    assert periods[1].ended_at is None and periods[1].salt != first.salt
    assert periods[0].salt == first.salt  # the old assignment can be computed again
    with pytest.raises(ValueError):
        holdout.holdout_set(organization=org, percent=16)


def test_a_campaign_never_reaches_the_global_holdout(wa, sandbox, run_jobs):
    people = wa["customers"](200)
    holdout.holdout_set(organization=wa["org"], percent=15)
    held = holdout.in_holdout(organization=wa["org"], customer_ids=[p.pk for p in people])
    assert held
    lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    received = {m["to"] for m in sandbox.messages()}
    assert len(received) == 200 - len(held)
    assert not received & {p.phone.lstrip("+") for p in people if p.pk in held}


def test_attribution_uses_the_channels_own_window_and_may_require_engagement(wa):
    people = wa["customers"](3)
    org = wa["org"]
    campaign = wa["campaign"](status=Campaign.Status.SENT)
    t0 = timezone.now() - timedelta(days=20)
    messages = [
        WhatsappMessage.objects.create(
            campaign=campaign, organization_id=org.pk, customer=p, status="delivered", sent_at=t0
        )
        for p in people
    ]
    org.attribution_window_whatsapp_days = 3
    org.save()
    late = _sale(wa["store"], people[0], t0 + timedelta(days=5))
    early = _sale(wa["store"], people[1], t0 + timedelta(days=2))
    assert not SaleAttribution.objects.filter(sale=late).exists()  # within 7, not within WhatsApp's 3
    assert SaleAttribution.objects.filter(sale=early).exists()
    org.attribution_engaged_only = True
    org.save()
    WhatsappMessage.objects.filter(pk=messages[2].pk).update(read_at=t0 + timedelta(hours=1))
    read = _sale(wa["store"], people[2], t0 + timedelta(days=1))
    unread = _sale(wa["store"], people[1], t0 + timedelta(days=1))
    assert SaleAttribution.objects.filter(sale=read).exists()
    assert not SaleAttribution.objects.filter(sale=unread).exists()
    attribution.organization_attribute(organization_id=org.pk)
    assert not SaleAttribution.objects.filter(sale=early).exists()  # not engaged: no longer credited


def test_the_campaign_page_shows_attributed_and_incremental_and_says_when_not_significant(
    wa, run_jobs, admin_client, english
):
    people = wa["customers"](60)
    draft = wa["campaign"](control_percent=20)
    _sale(wa["store"], people[0], timezone.now() - timedelta(days=1))
    page = admin_client.get(f"/admin/campaigns/campaign/{draft.pk}/change/").content.decode()
    assert "control group 20%: the smallest lift of the buyers rate it can detect is +" in page
    campaign = lifecycle.campaign_start(campaign=draft)
    run_jobs()
    page = admin_client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert 'id="campaign-lift"' in page
    assert "attributed (last touch)" in page and "incremental" in page
    # No sale in either group yet: nothing to compare (no "lift" made of the groups' sizes).
    assert 'data-significant="no"' in page and "No sale yet in either group" in page
    assert "No sale yet in either group" in _status_text(campaign) and "None" not in _status_text(campaign)
    treated = WhatsappMessage.objects.filter(campaign=campaign).exclude(status="held_out").first()
    _sale(wa["store"], treated.customer, timezone.now())
    page = admin_client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert 'data-significant="no"' in page and "Not significant" in page
    plain = wa["campaign"](name="No control")
    page = admin_client.get(f"/admin/campaigns/campaign/{plain.pk}/change/").content.decode()
    assert "no control group: only attributed (last touch) sales will be shown" in page


def test_an_organization_manager_changes_the_holdout_and_its_history_is_kept(wa, admin_client):
    org = wa["org"]
    holdout.holdout_set(organization=org, percent=5)
    admin_client.post(
        "/admin/crm/organization/",
        {"action": "holdout_reshuffle", "_selected_action": [org.pk]},
    )
    assert HoldoutPeriod.objects.filter(organization=org).count() == 2
    assert HoldoutPeriod.objects.filter(organization=org, ended_at__isnull=True).count() == 1


def test_the_demos_sales_respond_to_the_campaign_and_its_report_shows_the_lift(wa):
    from project.demo_lift import demo_campaign_sales

    people = wa["customers"](3000)
    campaign = wa["campaign"](control_percent=50, status=Campaign.Status.SENT)
    sent = timezone.now() - timedelta(days=8)
    WhatsappMessage.objects.bulk_create(
        WhatsappMessage(
            campaign=campaign,
            organization_id=p.organization_id,
            customer=p,
            status="held_out" if i % 2 else "read",
            sent_at=sent,
            token=f"demo-{i}",
        )
        for i, p in enumerate(people)
    )
    written = demo_campaign_sales(campaign=campaign, base_rate=0.1, uplift=1.0)
    assert 300 < written < 700  # 1,500 * 10% + 1,500 * 20%, ± 5 standard deviations
    report = lift.campaign_lift(campaign=campaign)
    assert report is not None
    assert report["treatment"]["buyers"] + report["control"]["buyers"] == written
    low, high = report["buyers_rate_lift_ci95"]
    assert low > 0 and high > 0.5 and report["significant"]  # a true +100%: detected
    assert Decimal(report["incremental_revenue"]) > 0


def test_an_email_campaigns_control_group_receives_no_email(smtp, em, run_jobs):  # noqa: F811
    people = em["customers"](150)
    campaign = lifecycle.campaign_start(campaign=em["campaign"](control_percent=40))
    run_jobs()
    campaign.refresh_from_db()
    assert campaign.status == Campaign.Status.SENT
    rows = EmailMessage.objects.filter(campaign=campaign)
    held = set(rows.filter(status="held_out").values_list("customer_id", flat=True))
    sent = set(rows.filter(status="sent").values_list("customer_id", flat=True))
    assert held and len(held) + len(sent) == 150
    emails = {p.pk: p.email for p in people}
    received = {to for m in smtp.messages() for to in m["rcpt_tos"]}
    assert received == {emails[c] for c in sent}
    assert all(at is not None for at in rows.filter(status="held_out").values_list("sent_at", flat=True))
    assert _status_json(campaign)["counts"]["held_out"] == len(held)


T0 = datetime(2026, 11, 2, 15, 0, tzinfo=UTC)
HOURS = st.integers(min_value=0, max_value=24 * 10)
STATUSES = ("held_out", "sent", "read", "failed")


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    window_days=st.integers(min_value=1, max_value=4),
    whatsapp_days=st.one_of(st.none(), st.integers(min_value=1, max_value=4)),
    messages=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 2), HOURS, st.sampled_from(STATUSES)), max_size=9
    ),
    sales=st.lists(st.tuples(st.integers(0, 3), HOURS, st.integers(1, 50_000)), max_size=10),
)
def test_the_lift_rollup_equals_a_reference_recount(world, window_days, whatsapp_days, messages, sales):
    org, store, customers = world["org"], world["store"], world["customers"]
    Sale.objects.filter(organization=org).delete()
    Campaign.objects.filter(organization=org).delete()
    org.attribution_window_days, org.attribution_window_whatsapp_days = window_days, whatsapp_days
    org.save()
    # Campaign 2 has no control group: its messages never count.
    campaigns = [
        Campaign.objects.create(
            organization=org, name=f"C{i}", status=Campaign.Status.SENT, control_percent=p
        )
        for i, p in enumerate((10, 50, 0))
    ]
    window = timedelta(days=whatsapp_days or window_days)
    touches: dict[tuple[int, int], tuple[datetime, bool]] = {}
    for campaign_index, customer_index, hours, status in messages:
        campaign, customer = campaigns[campaign_index], customers[customer_index]
        if (campaign.pk, customer.pk) in touches:
            continue
        at = T0 + timedelta(hours=hours)
        WhatsappMessage.objects.create(
            campaign=campaign, organization_id=org.pk, customer=customer, status=status, sent_at=at
        )
        touches[(campaign.pk, customer.pk)] = (at, status == "held_out")
    written = [
        _sale(store, customers[c] if c < 3 else None, T0 + timedelta(hours=h), str(Decimal(cents) / 100))
        for c, h, cents in sales
    ]
    expected = {
        (campaign_id, sale.pk): (held, sale.total)
        for sale in written
        for (campaign_id, customer_id), (at, held) in touches.items()
        if customer_id == sale.customer_id
        and at <= sale.sold_at <= at + window
        and campaign_id != campaigns[2].pk
    }
    rows = {(r.campaign_id, r.sale_id): (r.control, r.total) for r in LiftSale.objects.all()}
    assert rows == expected
    for campaign in campaigns[:2]:
        report = lift.campaign_lift(campaign=campaign)
        assert report is not None
        for arm, held in (("treatment", False), ("control", True)):
            mine = {s for (c, s), (h, _) in expected.items() if c == campaign.pk and h == held}
            buyers = {next(w.customer_id for w in written if w.pk == s) for s in mine}
            assert report[arm]["buyers"] == len(buyers)
            total = sum((expected[(campaign.pk, s)][1] for s in mine), Decimal("0"))
            assert Decimal(report[arm]["revenue"]) == total


def test_an_open_interval_is_null_in_json_and_plus_infinity_on_the_pages():
    # 3 buyers in 1,000 treated, none of 10 held out: the upper end has no limit.
    report = lift.lift_report(
        treatment=lift.ArmFigures(1000, 3, Decimal("300.00"), Decimal("30000.00")),
        control=lift.ArmFigures(10, 0, Decimal("0"), Decimal("0")),
        window_days=7,
    )
    low, high = report["buyers_rate_lift_ci95"]
    assert high is None and low is not None and low < 0 and not report["significant"]
    assert "Infinity" not in json.dumps(report, default=str)
    line = lift_pages.summary_line(report)
    assert "+∞" in line and "None" not in line and "%" in line  # percentages, as on the page
    assert "+∞" in lift_pages._verdict(report)
