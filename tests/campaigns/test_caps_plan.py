"""The contact caps' check is plan-stable (campaigns.caps): whatever the planner's statistics say
(a fresh table, one a fan-out has just filled, one analyzed with history), the message tables are
read through their (customer, sent_at) index, never scanned whole, with the same plan shape.

Every SELECT the check runs is EXPLAINed on its own cursor just before it runs (in its own
transaction, with its own settings), so these tests see the plans the real statements get."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns import caps
from campaigns.models import Campaign, EmailMessage, WhatsappMessage
from crm.models import Organization

MESSAGE_TABLES = {WhatsappMessage._meta.db_table, EmailMessage._meta.db_table}


@contextmanager
def explained() -> Iterator[list[dict[str, Any]]]:
    """The plans (EXPLAIN's JSON) of every SELECT run on this connection meanwhile, each in the
    round trip it runs in (with the settings the statements before it in that round trip set)."""
    plans: list[dict[str, Any]] = []

    def explain(execute: Callable, sql: str, params: Any, many: bool, context: dict) -> Any:
        parts = sql.split("; ")
        selects = [p.lstrip().upper().startswith(("SELECT", "WITH")) for p in parts]
        if any(selects):
            explaining = "; ".join(
                f"EXPLAIN (FORMAT JSON) {p}" if select else p
                for p, select in zip(parts, selects, strict=True)
            )
            with context["connection"].connection.cursor() as raw:
                raw.execute(explaining, params)
                while True:
                    if raw.description is not None and raw.description[0].name == "QUERY PLAN":
                        plans.append(raw.fetchone()[0][0]["Plan"])
                    if not raw.nextset():
                        break
        return execute(sql, params, many, context)

    with connection.execute_wrapper(explain):
        yield plans


def scans(plan: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(node type, relation, index) of every node of `plan` that reads a message table."""
    found = []
    if plan.get("Relation Name") in MESSAGE_TABLES:
        found.append((plan["Node Type"], plan["Relation Name"], plan.get("Index Name", "")))
    for child in plan.get("Plans", []):
        found += scans(child)
    return found


# How the rows a plan reads are aggregated and what is joined on (small: one page's) may vary.
_FREE = {"Aggregate", "Sort", "Incremental Sort", "Materialize", "Memoize", "Result", "Hash"}


def shape(plan: dict[str, Any]) -> list[str]:
    """The plan's scans and joins depth first, with the index each reads a message table through."""
    index = f"[{plan['Index Name']}]" if plan.get("Relation Name") in MESSAGE_TABLES else ""
    own = [] if plan["Node Type"] in _FREE else [plan["Node Type"] + index]
    return [*own, *(node for child in plan.get("Plans", []) for node in shape(child))]


def _write_history(org: Organization, campaign: Campaign, *, customers: int, per_customer: int) -> None:
    """`per_customer` sent messages (of other campaigns, gone: no foreign key) to each of `customers`
    customer ids over 90 days, and one queued message each of `campaign` (fanned out, not sent
    yet), in bulk: no ANALYZE."""
    table = WhatsappMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (campaign_id, organization_id, customer_id, batch, token, queued_at, "  # noqa: S608
            "status, error_reason, sent_at, attempts, phone, wa_id, cost, cost_currency) "
            "SELECT CASE WHEN k = 0 THEN %s ELSE 1000000 + k END, %s, c, 0, "
            "left(md5(c || '-' || k), 22), now(), "
            "CASE WHEN k = 0 THEN 'queued' ELSE 'sent' END, '', "
            "CASE WHEN k = 0 THEN NULL ELSE now() - (k * interval '90 days' / %s) END, 0, '', '', 0, '' "
            "FROM generate_series(1, %s) AS c, generate_series(0, %s) AS k",
            [campaign.pk, org.pk, per_customer, customers, per_customer],
        )


def _plans(campaign: Campaign, ids: list[int]) -> list[dict[str, Any]]:
    with explained() as plans:
        caps.skip_reasons(campaign=campaign, customer_ids=ids, now=timezone.now())
    return plans


def _sql(statement: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement)


def _states(wa: dict) -> dict[str, list[dict[str, Any]]]:
    """The caps' plans in the states the message table is met in, built for real (no statistics
    written by hand), in an order that makes each one: empty and never analyzed; empty and analyzed
    (a fresh database after autovacuum: the state in which CI saw the partial (campaign, sent_at)
    index read instead); filled in bulk with the empty table's statistics; analyzed with history;
    a fan-out's queued rows beside a few sent ones, analyzed (the partial index tiny beside the
    customer index); then twenty campaigns' rows more on those statistics."""
    org = wa["org"]
    org.block_multiple_campaigns = True
    org.save()
    earlier = wa["campaign"](name="Earlier", status=Campaign.Status.SENDING, started_at=timezone.now())
    campaign = wa["campaign"](name="Now", status=Campaign.Status.SENDING, started_at=timezone.now())
    table = WhatsappMessage._meta.db_table
    ids = list(range(1, 5001))
    _sql(f"TRUNCATE {table}")
    states = {"empty, never analyzed": _plans(campaign, ids)}
    _sql(f"ANALYZE {table}")
    states["empty, analyzed"] = _plans(campaign, ids)
    _write_history(org, earlier, customers=20_000, per_customer=5)
    states["filled, statistics of the empty table"] = _plans(campaign, ids)
    _sql(f"ANALYZE {table}")
    states["analyzed"] = _plans(campaign, ids)
    _sql(f"TRUNCATE {table}")
    _write_history(org, earlier, customers=50_000, per_customer=0)
    _sql(f"UPDATE {table} SET status = 'sent', sent_at = now() WHERE customer_id <= 50")  # noqa: S608
    _sql(f"ANALYZE {table}")
    states["queued fan-out, a few sent, analyzed"] = _plans(campaign, ids)
    # Twenty more campaigns since, the statistics still of one: where the unique (campaign,
    # customer) index's skip scan is estimated at one descent, and would cost twenty.
    _sql(
        f"INSERT INTO {table} (campaign_id, organization_id, customer_id, batch, token, queued_at, "  # noqa: S608
        "status, error_reason, sent_at, attempts, phone, wa_id, cost, cost_currency) "
        f"SELECT 2000000 + k, {org.pk}, c, 0, left(md5(c || '/' || k), 22), now(), 'queued', '', NULL, 0, "
        "'', '', 0, '' FROM generate_series(1, 10000) AS c, generate_series(1, 20) AS k"
    )
    states["twenty campaigns since, statistics of one"] = _plans(campaign, ids)
    return states


# The unique (campaign, customer) index: `customer_id = …` matches its second column (a skip scan
# over the campaigns), so it is the one other index that can serve a probe (campaigns.caps).
ONCE = {
    c.name
    for model in (WhatsappMessage, EmailMessage)
    for c in model._meta.constraints
    if getattr(c, "fields", ()) == ("campaign", "customer")
}


def test_the_caps_read_the_message_tables_through_the_customer_index_in_every_state(wa):
    """With rows in the table, every probe reads the (customer, sent_at) index, with one plan
    shape. On a table with no page at all every estimate is clamped to one row and PostgreSQL may
    pick the unique (campaign, customer) index by a hair (both read nothing there); never the
    partial (campaign, sent_at) index nor one by status, which the code before read there."""
    states = _states(wa)
    for state, plans in states.items():
        read = [s for plan in plans for s in scans(plan)]
        assert read, state
        assert all(kind != "Seq Scan" for kind, _, _ in read), (state, read)
        empty = state.startswith("empty")
        assert all(index.endswith("_customer_sent") or (empty and index in ONCE) for _, _, index in read), (
            state,
            read,
        )
    shapes = {s: [shape(p) for p in plans] for s, plans in states.items() if not s.startswith("empty")}
    assert len({repr(s) for s in shapes.values()}) == 1, shapes


class _Rollback(Exception):
    pass


def test_no_other_index_than_the_unique_one_can_serve_the_caps(wa):
    """By construction, not by costs: with the (customer, sent_at) indexes gone (in a transaction
    rolled back), the probes have no index left to read but the unique (campaign, customer) one —
    no partial index whose predicate the window implies, no index by sent_at or status."""
    indexes = [i.name for model in (WhatsappMessage, EmailMessage) for i in model._meta.indexes]
    customer = [name for name in indexes if name.endswith("_customer_sent")]
    org = wa["org"]
    org.block_multiple_campaigns = True
    org.save()
    earlier = wa["campaign"](name="Earlier", status=Campaign.Status.SENDING, started_at=timezone.now())
    campaign = wa["campaign"](name="Now", status=Campaign.Status.SENDING, started_at=timezone.now())
    _write_history(org, earlier, customers=2_000, per_customer=5)
    read: list[tuple[str, str, str]] = []
    with pytest.raises(_Rollback), transaction.atomic():
        for name in customer:
            _sql(f"DROP INDEX {name}")
        for analyze in (False, True):
            if analyze:
                _sql(f"ANALYZE {WhatsappMessage._meta.db_table}")
            read += [s for plan in _plans(campaign, list(range(1, 1001))) for s in scans(plan)]
        raise _Rollback
    assert read
    assert {index for _, _, index in read} <= ONCE | {""}, read


@pytest.fixture
def history(wa) -> dict:
    """A customer, and a campaign already sent after which the tests number earlier ones."""
    people = wa["customers"](1)
    other = wa["campaign"](name="Other", status=Campaign.Status.SENT)
    return {**wa, "people": people, "other": other}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ages=st.lists(st.integers(min_value=0, max_value=24 * 10), min_size=0, max_size=5),
    count=st.integers(min_value=1, max_value=4),
    days=st.integers(min_value=1, max_value=8),
    block=st.booleans(),
    failed=st.booleans(),
)
def test_the_limit_counts_reached_messages_within_the_window(history, ages, count, days, block, failed):
    """Hours-ago sends of another campaign to one customer: skipped over the limit (reached ones in
    the window), or within 24 h with the block on; never for a failed send's count."""
    org, (person, *_) = history["org"], history["people"]
    org.message_limit_count, org.message_limit_days, org.block_multiple_campaigns = count, days, block
    org.save()
    WhatsappMessage.objects.filter(customer=person).delete()
    now = timezone.now()
    status = WhatsappMessage.Status.FAILED if failed else WhatsappMessage.Status.DELIVERED
    WhatsappMessage.objects.bulk_create(
        [
            WhatsappMessage(
                campaign_id=history["other"].pk + 1000 + i,  # one campaign each (gone: no foreign key)
                organization=org,
                customer=person,
                status=status,
                sent_at=now - timedelta(hours=h, minutes=1),
                token=f"t{person.pk}-{i}",
            )
            for i, h in enumerate(ages)
        ]
    )
    campaign = history["campaign"](name="Now", status=Campaign.Status.SENDING, started_at=now)
    reasons = caps.skip_reasons(campaign=campaign, customer_ids=[person.pk, person.pk], now=now)
    recent = 0 if failed else sum(1 for h in ages if h < days * 24)
    if recent >= count:
        assert reasons == {
            person.pk: f"message limit: {recent} WhatsApp and email messages in the last {days} days "
            f"(at most {count})"
        }
    elif block and any(h < 24 for h in ages):
        assert reasons == {person.pk: caps.SENT_WITHIN_24H}
    else:
        assert reasons == {}
    campaign.delete()
