"""crm.bulk.analyze_if_grown: after a big bulk write the planner's statistics are refreshed at once,
on the real PostgreSQL (pg_class.reltuples is what ANALYZE writes)."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from crm import bulk
from crm.models import Customer, Organization


def _reltuples() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [Customer._meta.db_table])
        return float(cursor.fetchone()[0])


def test_a_table_is_analyzed_after_a_big_write_and_not_after_a_small_one(db):
    org = Organization.objects.create(name="Loja", slug="loja")
    Customer.objects.bulk_create(
        [
            Customer(organization=org, erp_id=f"A{i}", name=f"Cliente {i}")
            for i in range(bulk.ANALYZE_AFTER_ROWS)
        ]
    )
    before = _reltuples()
    bulk.analyze_if_grown(Customer, bulk.ANALYZE_AFTER_ROWS - 1)
    assert _reltuples() == before  # below the threshold: left to autovacuum
    bulk.analyze_if_grown(Customer, bulk.ANALYZE_AFTER_ROWS)
    assert _reltuples() >= bulk.ANALYZE_AFTER_ROWS  # the planner now knows the rows are there


def _analyzed_columns() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT attname FROM pg_stats WHERE tablename = %s", [Customer._meta.db_table])
        return {row[0] for row in cursor.fetchall()}


def test_only_the_fields_given_are_analyzed_and_the_table_size_is_refreshed(db):
    org = Organization.objects.create(name="Loja", slug="loja")
    Customer.objects.bulk_create(
        [
            Customer(organization=org, erp_id=f"A{i}", name=f"Cliente {i}")
            for i in range(bulk.ANALYZE_AFTER_ROWS)
        ]
    )
    before = _analyzed_columns()  # autovacuum may have analyzed the table before this test
    bulk.analyze_if_grown(Customer, bulk.ANALYZE_AFTER_ROWS, ["organization_id", "erp_id"])
    assert _reltuples() >= bulk.ANALYZE_AFTER_ROWS
    after = _analyzed_columns()
    assert {"organization_id", "erp_id"} <= after and after - before <= {"organization_id", "erp_id"}


def test_with_a_share_a_write_that_leaves_the_table_s_shape_is_not_analyzed(db):
    org = Organization.objects.create(name="Loja", slug="loja")
    many = 10 * bulk.ANALYZE_AFTER_ROWS
    Customer.objects.bulk_create(
        [Customer(organization=org, erp_id=f"A{i}", name=f"Cliente {i}") for i in range(many)]
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Customer._meta.db_table}")
    known = _reltuples()
    assert known >= many
    # 10,000 rows more, under a fifth of the 100,000 the statistics know: left to autovacuum
    Customer.objects.bulk_create(
        [
            Customer(organization=org, erp_id=f"B{i}", name=f"Cliente {i}")
            for i in range(bulk.ANALYZE_AFTER_ROWS)
        ]
    )
    bulk.analyze_if_grown(Customer, bulk.ANALYZE_AFTER_ROWS, share=0.2)
    assert _reltuples() == known
    # the same write is a tenth of the table or more: analyzed now
    bulk.analyze_if_grown(Customer, bulk.ANALYZE_AFTER_ROWS, share=0.05)
    assert _reltuples() >= many + bulk.ANALYZE_AFTER_ROWS


def _changed_since_analyze() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT coalesce(n_mod_since_analyze, 0) FROM pg_stat_user_tables WHERE relid = %s::regclass",
            [Customer._meta.db_table],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_rows_others_wrote_since_the_last_analyze_are_left_to_autovacuum():
    """A small write beside many un-analyzed rows of others (a campaign beside a history whose
    statistics are behind) is not analyzed: its own rows are what count against the share."""
    table = Customer._meta.db_table
    with connection.cursor() as cursor:  # autovacuum would analyze the table meanwhile, all of it
        cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    try:
        _left_to_autovacuum()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


def _left_to_autovacuum() -> None:
    org = Organization.objects.create(name="Loja", slug="loja")
    fields = ["organization_id", "erp_id", "name"]
    bulk.copy_rows(Customer, fields, ((org.pk, f"A{i}", "x") for i in range(10 * bulk.ANALYZE_AFTER_ROWS)))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Customer._meta.db_table} (name)")
    others = 2 * bulk.ANALYZE_AFTER_ROWS  # a fifth of the table, written and committed by others
    bulk.copy_rows(Customer, fields, ((org.pk, f"B{i}", "x") for i in range(others)))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    deadline = time.monotonic() + 60
    while _changed_since_analyze() < others and time.monotonic() < deadline:
        time.sleep(0.05)  # the counts are reported when the writer goes idle
    assert _changed_since_analyze() >= others
    # Row counts, not which columns have statistics: an earlier test's ANALYZE leaves those.
    known = _reltuples()
    assert known == 10 * bulk.ANALYZE_AFTER_ROWS
    bulk.analyze_if_grown(Customer, bulk.ANALYZE_AFTER_ROWS, ["erp_id"], share=0.15)
    assert _reltuples() == known  # 10,000 of the 100,000 known: under the share, not analyzed
    bulk.analyze_if_grown(Customer, bulk.ANALYZE_AFTER_ROWS, ["erp_id"], share=0.1)
    assert _reltuples() == known + others  # at the share: analyzed, every row counted
