"""Migrations that index the big, busy tables build their indexes CONCURRENTLY, so sends and runs
keep writing while a deploy migrates."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.parametrize(
    ("app", "migration", "created", "dropped"),
    [
        ("campaigns", "0006", 11, 2),
        ("runner", "0002", 1, 1),
        ("crm", "0011", 2, 1),
        ("crm", "0015_fair", 1, 1),
    ],
)
def test_indexes_on_written_tables_are_built_and_dropped_concurrently(
    transactional_db, app, migration, created, dropped
):
    out = StringIO()
    call_command("sqlmigrate", app, migration, stdout=out)
    sql = out.getvalue()
    assert "BEGIN;" not in sql  # CONCURRENTLY cannot run inside a transaction
    assert sql.count("CREATE INDEX CONCURRENTLY") == created
    assert sql.count("DROP INDEX CONCURRENTLY") == dropped
    assert sql.count("CREATE INDEX") == created  # no plain (write-blocking) build among them
