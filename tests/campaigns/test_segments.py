"""Daily RFM segment snapshots: the rules, idempotence, movement, pruning, the audience, the command,
the cron entry and the admin pages. Real PostgreSQL and Redis."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from campaigns import lifecycle, segments, selectors, tasks
from campaigns.admin.big_tables import CappedCountPaginator
from campaigns.admin.segments import CustomerSegmentAdmin
from campaigns.models import Campaign, CustomerSegment, Segment, SegmentMovement, WhatsappMessage
from crm import cron, queues
from crm.models import Customer, JobRun, Membership, Organization, Sale, Store

SP = ZoneInfo("America/Sao_Paulo")
DAY = date(2026, 11, 29)
_erp_ids = itertools.count(1)


def sale(
    store: Store, customer: Customer | None, *, on: date, total: str = "100", at: time = time(12)
) -> Sale:
    """A sale at `at` local time (São Paulo) on `on`."""
    return Sale(
        organization_id=store.organization_id,
        store=store,
        customer=customer,
        erp_id=f"S{next(_erp_ids)}",
        total=Decimal(total),
        sold_at=datetime.combine(on, at, tzinfo=SP),
    )


def bought(store: Store, customer: Customer, *days_before: int, total: str = "100", day: date = DAY) -> None:
    Sale.objects.bulk_create(
        [sale(store, customer, on=day - timedelta(days=d), total=total) for d in days_before]
    )


def customer(org: Organization, name: str, **fields) -> Customer:
    return Customer.objects.create(
        organization=org, name=name, phone=fields.pop("phone", ""), erp_id=name, **fields
    )


def rows(org: Organization, day: date) -> dict[str, tuple]:
    """{customer name: (segment, recency, frequency, monetary, r, f, m)} of one snapshot."""
    return {
        r.customer.name: (r.segment, r.recency_days, r.frequency, r.monetary, r.r_score, r.f_score, r.m_score)
        for r in CustomerSegment.objects.filter(organization=org, day=day).select_related("customer")
    }


def segment_of(org: Organization, day: date) -> dict[str, str]:
    return {name: row[0] for name, row in rows(org, day).items()}


def population(org: Organization, store: Store, n: int, *, prefix: str = "P", day: date = DAY) -> None:
    """`n` customers with 1 to 3 sales each in the year before `day`, bulk-created."""
    people = Customer.objects.bulk_create(
        [Customer(organization=org, name=f"{prefix}{i}", erp_id=f"{prefix}{i}") for i in range(n)]
    )
    Sale.objects.bulk_create(
        [
            sale(
                store, c, on=day - timedelta(days=(i * 7 + k * 31) % 360 + 31), total=str(20 + (i * 13) % 500)
            )
            for i, c in enumerate(people)
            for k in range(1 + i % 3)
        ]
    )


@pytest.fixture
def shop(db) -> dict:
    org = Organization.objects.create(name="Loja Teste", slug="teste", timezone="America/Sao_Paulo")
    store = Store.objects.create(organization=org, erp_code="001", name="Centro")
    return {"org": org, "store": store}


# --- The rules --------------------------------------------------------------------------------------


def test_known_customers_land_in_the_expected_segments(shop):
    org, store = shop["org"], shop["store"]
    champion = customer(org, "champion")
    bought(store, champion, 1, *range(10, 120, 10), total="500")  # 12 sales, the latest yesterday
    newcomer = customer(org, "new")
    # Bought at 23:30 on the snapshot day in São Paulo (02:30 UTC the day after): it counts, 0 days ago.
    Sale.objects.bulk_create([sale(store, newcomer, on=DAY, total="80", at=time(23, 30))])
    gone = customer(org, "lost")
    bought(store, gone, 400, 500, total="900")
    Sale.objects.bulk_create([sale(store, gone, on=DAY + timedelta(days=1))])  # after the snapshot: ignored
    at_risk = customer(org, "at_risk")
    bought(store, at_risk, *range(300, 340, 5), total="400")  # 8 sales, none in the last 300 days
    sleeper = customer(org, "hibernating")
    bought(store, sleeper, 330, total="20")
    twins = [customer(org, "twin-a"), customer(org, "twin-b")]
    for twin in twins:
        bought(store, twin, 50, 60, total="150")
    for i in range(10):  # the middle of the distribution
        bought(
            store, customer(org, f"filler{i}"), *[20 + 18 * i + 5 * k for k in range(2 + i % 3)], total="120"
        )
    customer(org, "never bought")
    tomorrow = customer(org, "tomorrow")
    Sale.objects.bulk_create([sale(store, tomorrow, on=DAY + timedelta(days=1), at=time(0, 30))])
    other = Organization.objects.create(name="Outra", slug="outra")
    other_store = Store.objects.create(organization=other, erp_code="9", name="Outra")
    bought(other_store, customer(other, "elsewhere"), 1, 2, 3, total="9999")

    counts = segments.segments_snapshot(organization_id=org.pk, day=DAY)

    got = rows(org, DAY)
    assert got["champion"] == (Segment.CHAMPIONS, 1, 12, Decimal("6000.00"), 5, 5, 5)
    assert got["new"][:4] == (Segment.NEW, 0, 1, Decimal("80.00"))
    assert got["lost"] == (Segment.LOST, 400, 0, Decimal("0.00"), None, None, None)
    assert got["at_risk"][0] == Segment.AT_RISK and got["at_risk"][4:] == (1, 5, 5)
    assert got["hibernating"] == (Segment.HIBERNATING, 330, 1, Decimal("20.00"), 1, 1, 1)
    assert got["twin-a"] == got["twin-b"]  # bought alike: same scores, same segment
    assert "never bought" not in got and "tomorrow" not in got and "elsewhere" not in got
    assert len(got) == 17
    assert counts == {s: sum(1 for r in got.values() if r[0] == s) for s in Segment.values}
    assert list(counts) == Segment.values and sum(counts.values()) == 17
    assert not CustomerSegment.objects.filter(organization=other).exists()


def documented_segment(r: int, f: int, m: int) -> str:
    """The module docstring's table, for a customer who bought in the year but not first in 30 days."""
    if r >= 4 and f + m >= 7:
        return Segment.CHAMPIONS
    if r >= 3 and f + m >= 5:
        return Segment.LOYAL
    if r >= 4:
        return Segment.PROMISING
    if r == 3:
        return Segment.NEED_ATTENTION
    if f + m >= 5:
        return Segment.AT_RISK
    return Segment.ABOUT_TO_SLEEP if r == 2 else Segment.HIBERNATING


def test_every_customer_follows_the_documented_rules_and_ties_share_a_score(shop):
    population(shop["org"], shop["store"], 500)
    segments.segments_snapshot(organization_id=shop["org"].pk, day=DAY)

    snapshot = list(CustomerSegment.objects.filter(day=DAY))
    active = [r for r in snapshot if r.frequency]
    for row in snapshot:
        if row.frequency:
            assert row.segment == documented_segment(row.r_score, row.f_score, row.m_score), row.__dict__
        else:
            assert row.segment == Segment.LOST and row.recency_days > 364 and row.r_score is None
    assert {r.segment for r in snapshot} == set(Segment) - {Segment.NEW}  # every other rule is used
    for value, score in (("recency_days", "r_score"), ("frequency", "f_score"), ("monetary", "m_score")):
        scores: dict = {}
        for row in active:
            scores.setdefault(getattr(row, value), set()).add(getattr(row, score))
        assert all(len(s) == 1 for s in scores.values()), value  # a tie never splits across scores
        ordered = [next(iter(scores[v])) for v in sorted(scores, reverse=value == "recency_days")]
        assert ordered == sorted(ordered) and ordered[0] == 1, value  # worst to best
        # Frequency has three values here, the best tied across tiles 4-5: it gets 4.
        assert ordered[-1] == (4 if value == "frequency" else 5), value


def test_every_segment_has_one_rule_and_the_catch_all_is_last():
    assert [r.segment for r in segments.RULES][:2] == [Segment.LOST, Segment.NEW]
    assert sorted(r.segment for r in segments.RULES) == sorted(Segment)
    assert segments.RULES[-1].sql == "1 = 1"


# --- Idempotence and scale --------------------------------------------------------------------------


def test_rerunning_a_day_replaces_its_rows_with_the_same_ones(shop):
    population(shop["org"], shop["store"], 300)
    first = segments.segments_snapshot(organization_id=shop["org"].pk, day=DAY)
    before = rows(shop["org"], DAY)
    ids_before = set(CustomerSegment.objects.values_list("pk", flat=True))

    again = segments.segments_snapshot(organization_id=shop["org"].pk, day=DAY)

    assert again == first and rows(shop["org"], DAY) == before and len(before) == 300
    assert not ids_before & set(CustomerSegment.objects.values_list("pk", flat=True))  # replaced, not kept
    assert CustomerSegment.objects.count() == 300
    assert SegmentMovement.objects.filter(day=DAY).count() == len([n for n in first.values() if n])


def test_the_snapshot_runs_the_same_queries_for_100_or_2000_customers(db):
    sizes = {}
    for n in (100, 2000):
        org = Organization.objects.create(name=f"Loja {n}", slug=f"loja-{n}")
        store = Store.objects.create(organization=org, erp_code="1", name="Centro")
        population(org, store, n, prefix=f"L{n}-")
        segments.segments_snapshot(organization_id=org.pk, day=DAY - timedelta(days=1))  # a previous day
        with CaptureQueriesContext(connection) as queries:
            counts = segments.segments_snapshot(organization_id=org.pk, day=DAY)
        assert sum(counts.values()) == n
        sizes[n] = len(queries)
    # The same statements whatever the size; a page of customers who entered a segment (here only
    # among the 2,000) adds the customer-events consumers' few queries, once per page of 5,000.
    assert sizes[100] <= sizes[2000] <= sizes[100] + 3 <= 18, sizes


# --- Movement ------------------------------------------------------------------------------------


def test_movement_between_two_days_is_counted_per_pair_of_segments(shop):
    org, store = shop["org"], shop["store"]
    day1, day2 = DAY - timedelta(days=60), DAY
    population(org, store, 40, day=day1)
    rookie = customer(org, "rookie")
    bought(store, rookie, 5, total="50", day=day1)  # new on day 1
    # ... then buys every few days, a lot: a champion on day 2 (first sale 65 days before it).
    bought(store, rookie, *range(1, 55, 4), total="900")
    leaver = customer(org, "leaver")
    bought(store, leaver, 200, total="70", day=day1)
    latecomer = customer(org, "latecomer")
    bought(store, latecomer, 2)  # first sale after day 1: new on day 2

    def stored() -> dict[tuple[str, str], int]:
        movement = SegmentMovement.objects.filter(organization=org, day=day2)
        assert {m.previous_day for m in movement} == {day1}
        return {(m.from_segment, m.to_segment): m.customers for m in movement}

    def expected() -> dict[tuple[str, str], int]:
        before, after = segment_of(org, day1), segment_of(org, day2)
        return dict(Counter((before.get(n, ""), after.get(n, "")) for n in before.keys() | after.keys()))

    # The later day first, then day 1 as a backfill: day 2's movement is recomputed against it.
    segments.segments_snapshot(organization_id=org.pk, day=day2)
    assert set(SegmentMovement.objects.filter(day=day2).values_list("from_segment", flat=True)) == {""}
    segments.segments_snapshot(organization_id=org.pk, day=day1)
    assert stored() == expected()
    # The leaver's sales turn out to belong to nobody (reassigned in the ERP): gone from day 2.
    Sale.objects.filter(customer=leaver).update(customer=None)
    segments.segments_snapshot(organization_id=org.pk, day=day2)

    before, after = segment_of(org, day1), segment_of(org, day2)
    assert before["rookie"] == Segment.NEW and after["rookie"] == Segment.CHAMPIONS
    assert "latecomer" not in before and after["latecomer"] == Segment.NEW
    assert "leaver" in before and "leaver" not in after
    assert stored() == expected()
    assert expected()[(Segment.NEW, Segment.CHAMPIONS)] >= 1 and expected()[("", Segment.NEW)] == 1
    assert expected()[(before["leaver"], "")] == 1
    movement = segments.segment_movement(organization_id=org.pk, day=day2)
    assert movement.previous_day == day1
    assert movement.counts == {s: list(after.values()).count(s) for s in Segment.values}
    assert movement.previous_counts == {s: list(before.values()).count(s) for s in Segment.values}


def test_the_newest_snapshot_announces_who_entered_a_segment_and_a_flow_enrolls_them_once(shop):
    from crm import hooks
    from flows.models import Enrollment, Flow

    org, store = shop["org"], shop["store"]
    day1, day2 = DAY - timedelta(days=60), DAY
    population(org, store, 10, day=day1)
    rookie = customer(org, "rookie")
    bought(store, rookie, 5, total="50", day=day1)
    bought(store, rookie, *range(1, 55, 4), total="900")  # a champion on day 2
    flow = Flow.objects.create(
        organization=org,
        key="champions",
        name="Champions",
        trigger={"type": "segment_entered", "segment": Segment.CHAMPIONS},
        steps=[{"type": "wait", "days": 1}],
    )
    seen: list[hooks.CustomerEvent] = []
    hooks.on_customer_events("test-segments", lambda events: seen.extend(events) or 0)
    try:
        segments.segments_snapshot(organization_id=org.pk, day=day1)
        assert seen == []  # the first snapshot: nobody moved
        segments.segments_snapshot(organization_id=org.pk, day=day2)
        before, after = segment_of(org, day1), segment_of(org, day2)
        moved = {n for n in after if before.get(n) != after[n]}
        by_id = dict(Customer.objects.filter(organization=org).values_list("pk", "name"))
        assert {by_id[e.customer_id] for e in seen} == moved and "rookie" in moved
        assert all(
            e.kind == "segment_entered" and e.data == {"segment": after[by_id[e.customer_id]]} for e in seen
        )
        segments.segments_snapshot(organization_id=org.pk, day=day2)  # taken again
        segments.segments_snapshot(organization_id=org.pk, day=day1)  # a backfill announces nobody
        assert len(seen) == 2 * len(moved)
    finally:
        hooks.off_customer_events("test-segments")
    champions = {n for n in moved if after[n] == Segment.CHAMPIONS}
    enrolled = Enrollment.objects.filter(flow=flow).values_list("customer__name", flat=True)
    assert sorted(enrolled) == sorted(champions)


# --- The daily job: a checkpoint per organization and day, pruning -------------------------------


def test_the_daily_job_computes_a_day_once_and_keeps_segment_keep_days(shop, settings):
    settings.SEGMENT_KEEP_DAYS = 3
    org = shop["org"]
    population(org, shop["store"], 30)
    days = [DAY - timedelta(days=d) for d in range(5, -1, -1)]
    for day in days:
        counts = tasks.segments_snapshot_organization(organization_id=org.pk, day=day.isoformat())
        assert sum(counts.values()) > 0
    kept = sorted(set(CustomerSegment.objects.values_list("day", flat=True)))
    assert kept == days[-3:]
    assert sorted(set(SegmentMovement.objects.values_list("day", flat=True))) == days[-3:]
    runs = JobRun.objects.filter(kind="segments-snapshot", organization=org)
    assert runs.count() == 6 and set(runs.values_list("status", flat=True)) == {JobRun.Status.COMPLETED}
    # The same day again: the checkpoint says done, nothing is recomputed.
    ids = set(CustomerSegment.objects.filter(day=DAY).values_list("pk", flat=True))
    assert tasks.segments_snapshot_organization(organization_id=org.pk, day=DAY.isoformat()) == {}
    assert set(CustomerSegment.objects.filter(day=DAY).values_list("pk", flat=True)) == ids


def test_pruning_counts_from_the_newest_snapshot_and_spares_other_organizations(shop):
    org = shop["org"]
    population(org, shop["store"], 10)
    other = Organization.objects.create(name="Outra", slug="outra")
    population(other, Store.objects.create(organization=other, erp_code="1", name="X"), 10, prefix="O")
    for d in (0, 1, 2, 10):
        segments.segments_snapshot(organization_id=org.pk, day=DAY - timedelta(days=d))
    segments.segments_snapshot(organization_id=other.pk, day=DAY - timedelta(days=30))

    assert segments.segments_prune(organization_id=org.pk, keep_days=2) == 20  # two days of 10
    assert segments.segment_days(organization_id=org.pk) == [DAY, DAY - timedelta(days=1)]
    assert segments.segment_days(organization_id=other.pk) == [DAY - timedelta(days=30)]
    assert segments.segments_prune(organization_id=org.pk, keep_days=2) == 0


def test_the_cron_entry_runs_daily_at_3_and_snapshots_every_organization_with_sales(
    transactional_db, run_jobs
):
    entry = cron.cron_table()["segments-snapshot"]
    assert (entry.cron, entry.func, entry.queue) == (
        "0 3 * * *",
        "campaigns.tasks.segments_snapshot_all",
        queues.ERP_SYNC,
    )
    (next_run,) = entry.next_runs(after=datetime(2026, 11, 29, 12, 0, tzinfo=SP))
    assert next_run == datetime(2026, 11, 30, 3, 0, tzinfo=SP)  # TIME_ZONE is São Paulo

    org = Organization.objects.create(name="Loja", slug="loja", timezone="America/Manaus")
    store = Store.objects.create(organization=org, erp_code="1", name="Centro")
    population(org, store, 20, day=segments.default_day(org.timezone))
    Organization.objects.create(name="Sem vendas", slug="sem-vendas")

    cron.cron_fire("segments-snapshot")
    run_jobs([queues.ERP_SYNC], settle=0.5)

    yesterday = segments.default_day("America/Manaus")
    assert segments.segment_days() == [yesterday]
    assert CustomerSegment.objects.filter(organization=org, day=yesterday).count() == 20
    run = JobRun.objects.get(kind="segments-snapshot")
    assert (run.key, run.status, run.organization_id) == (
        f"{org.pk}:{yesterday}",
        JobRun.Status.COMPLETED,
        org.pk,
    )
    # Firing again the same day enqueues nothing: the day is done.
    assert tasks.segments_snapshot_all() == 0


# --- The audience --------------------------------------------------------------------------------


def test_a_segment_campaign_reaches_only_that_segment_of_the_latest_snapshot(wa, run_jobs):
    org, store = wa["org"], wa["store"]
    people = wa["customers"](9)
    day1, day2 = DAY - timedelta(days=40), DAY
    for c in people[:3]:
        bought(store, c, 2, day=day1)  # new on day 1, no longer on day 2
    for c in people[3:6]:
        bought(store, c, 400)  # lost on both days
    for c in people[6:]:
        bought(store, c, 1)  # new on day 2
    opted_out = people[8]
    Customer.objects.filter(pk=opted_out.pk).update(whatsapp_opted_out_at=datetime(2026, 1, 1, tzinfo=SP))
    campaign = wa["campaign"](audience_segment=Segment.NEW)
    assert not selectors.campaign_audience(campaign=campaign).exists()  # no snapshot yet: nobody

    segments.segments_snapshot(organization_id=org.pk, day=day1)
    assert set(selectors.campaign_audience(campaign=campaign)) == set(people[:3])
    segments.segments_snapshot(organization_id=org.pk, day=day2)
    assert set(selectors.campaign_audience(campaign=campaign)) == {people[6], people[7]}

    lifecycle.campaign_start(campaign=campaign)
    run_jobs()

    messaged = set(WhatsappMessage.objects.filter(campaign=campaign).values_list("customer_id", flat=True))
    assert messaged == {people[6].pk, people[7].pk}
    assert Campaign.objects.get(pk=campaign.pk).status == Campaign.Status.SENT
    everyone = wa["campaign"](name="Todos")
    assert selectors.campaign_audience(campaign=everyone).count() == 8  # no segment: the whole audience


# --- The command ---------------------------------------------------------------------------------


def test_the_command_prints_a_summary_per_organization_and_a_total(shop, english):
    org, store = shop["org"], shop["store"]
    population(org, store, 25)
    bought(store, customer(org, "novo"), 0)
    other = Organization.objects.create(name="Outra", slug="outra")
    population(other, Store.objects.create(organization=other, erp_code="1", name="X"), 5, prefix="O")
    Organization.objects.create(name="Sem vendas", slug="sem-vendas")

    out = StringIO()
    call_command("segments_snapshot", "--date", DAY.isoformat(), stdout=out)

    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert re.fullmatch(r"outra 2026-11-29: 5 customers in \d segments \(.+\) in \d+\.\ds", lines[0]), lines
    match = re.fullmatch(r"teste 2026-11-29: 26 customers in (\d) segments \((.+)\) in \d+\.\ds", lines[1])
    assert match, lines
    listed = dict(part.rsplit(" ", 1) for part in match.group(2).split(", "))
    counts = segments.segment_counts(organization_id=org.pk, day=DAY)
    labels = {s: f"{n:,}" for s, n in counts.items() if n}
    assert listed == {Segment(s).label: n for s, n in labels.items()} and int(match.group(1)) == len(listed)
    assert listed["new"] == "1"
    assert re.fullmatch(r"total: 2 organizations, 31 customers in \d+\.\ds", lines[2]), lines

    out = StringIO()
    call_command("segments_snapshot", "--org", "teste", "--date", "2026-11-28", stdout=out)
    assert out.getvalue().startswith("teste 2026-11-28: 25 customers")  # "novo" first bought on the 29th
    assert segments.segment_days(organization_id=org.pk) == [DAY, date(2026, 11, 28)]
    with pytest.raises(
        CommandError, match=r"no organization 'nope' \(organizations: outra, sem-vendas, teste\)"
    ):
        call_command("segments_snapshot", "--org", "nope", stdout=StringIO())


def test_the_summary_line_groups_thousands(english):
    counts = dict.fromkeys(Segment.values, 0) | {"champions": 1234, "lost": 11111, "at_risk": 2}
    assert segments.snapshot_summary("demo", DAY, counts, 0.84) == (
        "demo 2026-11-29: 12,347 customers in 3 segments (champions 1,234, at risk 2, lost 11,111) in 0.8s"
    )


def test_the_summary_line_speaks_the_operators_language():
    counts = dict.fromkeys(Segment.values, 0) | {"champions": 1234, "lost": 11111, "at_risk": 2}
    assert segments.snapshot_summary("demo", DAY, counts, 0.84) == (
        "demo 2026-11-29: 12.347 clientes em 3 segmentos (campeões 1.234, em risco 2, perdidos 11.111) "
        "em 0,8s"
    )


# --- The admin ---------------------------------------------------------------------------------------


@pytest.fixture
def staff(client, shop):
    """A manager of the shop's organization (the role, not Django's model permissions, decides)."""
    user = get_user_model().objects.create_user("ops", password="x-pw-12345")
    Membership.objects.create(user=user, organization=shop["org"], role=Membership.Role.MANAGER)
    client.force_login(user)
    return client


def test_the_admin_shows_counts_and_movement_for_staff_in_a_few_queries(shop, staff, client, english):
    org, store = shop["org"], shop["store"]
    population(org, store, 30)
    rookie = customer(org, "rookie")
    bought(store, rookie, 3)
    segments.segments_snapshot(organization_id=org.pk, day=DAY - timedelta(days=1))
    bought(store, customer(org, "latecomer"), 0)
    segments.segments_snapshot(organization_id=org.pk, day=DAY)
    counts = segments.segment_counts(organization_id=org.pk, day=DAY)
    other = Organization.objects.create(name="Outra", slug="outra")
    bought(Store.objects.create(organization=other, erp_code="1", name="X"), customer(other, "elsewhere"), 1)
    segments.segments_snapshot(organization_id=other.pk, day=DAY)  # new there too

    with CaptureQueriesContext(connection) as queries:
        page = staff.get("/admin/campaigns/customersegment/overview/")
    assert page.status_code == 200
    html = page.content.decode()
    for code, n in counts.items():
        assert re.search(rf'<tr data-segment="{code}">\s*<th>.*?</th>\s*<td data-count="{n}">', html, re.S), (
            code
        )
    assert 'data-segment="all"' in html and 'data-count="32"' in html
    new_row = re.search(r'<tr data-from="">(.*?)</tr>', html, re.S).group(1)
    assert re.search(r'data-to="new"[^>]*>1<', new_row)  # the latecomer, new to the snapshot
    stayed = re.search(r'<tr data-from="new">(.*?)</tr>', html, re.S).group(1)
    assert re.search(r'data-to="new" class="stayed">1<', stayed)  # the rookie is still new
    overview_queries = len(queries)
    assert overview_queries <= 8, [q["sql"][:90] for q in queries.captured_queries]

    # Another day, chosen explicitly: the first snapshot, everyone new to it.
    page = staff.get(
        f"/admin/campaigns/customersegment/overview/?organization={org.pk}&day={DAY - timedelta(days=1)}"
    )
    assert page.status_code == 200 and "every customer is new to it" in page.content.decode()

    # The customer list: the newest day by default, one segment, no COUNT over the whole day.
    new_customers = f"/admin/campaigns/customersegment/?organization__id__exact={org.pk}&segment__exact=new"
    with CaptureQueriesContext(connection) as queries:
        page = staff.get(new_customers)
    assert page.status_code == 200
    listed = {r.customer.name for r in page.context["cl"].result_list}
    assert listed == {name for name, s in segment_of(org, DAY).items() if s == Segment.NEW}
    assert {"rookie", "latecomer"} <= listed and "elsewhere" not in listed
    list_queries = len(queries)
    counts_sql = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(counts_sql) == 1 and "LIMIT 10001" in counts_sql[0], counts_sql
    # A member of one organization: the scope is the filter (a single-choice filter is not shown).
    assert f'"organization_id" IN ({org.pk})' in counts_sql[0], counts_sql[0]

    # Ten times the customers: the same number of queries on both pages.
    population(org, store, 300, prefix="Q")
    segments.segments_snapshot(organization_id=org.pk, day=DAY)
    with CaptureQueriesContext(connection) as queries:
        assert staff.get("/admin/campaigns/customersegment/overview/").status_code == 200
    assert len(queries) == overview_queries
    with CaptureQueriesContext(connection) as queries:
        assert staff.get(new_customers).status_code == 200
    assert len(queries) == list_queries

    # The campaign form offers the segment; the segment list is read-only.
    form = staff.get("/admin/campaigns/campaign/add/")
    assert form.status_code == 200 and 'name="audience_segment"' in form.content.decode()
    assert (
        staff.get(
            f"/admin/campaigns/customersegment/{CustomerSegment.objects.first().pk}/delete/"
        ).status_code
        == 403
    )
    client.logout()
    assert client.get("/admin/campaigns/customersegment/overview/").status_code == 302  # to the login page


def test_the_customer_list_pages_past_the_count_cap_without_counting_everything(
    shop, staff, monkeypatch, english
):
    population(shop["org"], shop["store"], 40)
    segments.segments_snapshot(organization_id=shop["org"].pk, day=DAY)
    monkeypatch.setattr(CappedCountPaginator, "cap", 25)
    monkeypatch.setattr(CustomerSegmentAdmin, "list_per_page", 10)

    page = staff.get("/admin/campaigns/customersegment/")

    assert page.status_code == 200
    cl = page.context["cl"]
    assert cl.result_count == 26 and cl.paginator.num_pages == 3  # 26 = "more than 25", not 40
    assert len(cl.result_list) == 10 and "More than 25 rows" in page.content.decode()
    assert staff.get("/admin/campaigns/customersegment/?p=3").status_code == 200
