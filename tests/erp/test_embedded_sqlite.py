"""The syncs' bulk upserts on the embedded SQLite database, as `make run` uses them: the commands in a
child process with no DATABASE_URL, against the sandbox."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.erp.conftest import recent_day

pytestmark = pytest.mark.slow


def test_the_syncs_run_on_the_embedded_sqlite_and_twice_change_nothing(sandbox_factory, tmp_path):
    sandbox = sandbox_factory(customers=3000, malformed_every=500)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(CRM_VAR_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1")
    (tmp_path / "var").mkdir()

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    manage("migrate", "--verbosity", "0")
    manage("demo", "--customers", "3", "--erp-url", sandbox.url)
    assert (tmp_path / "var" / "crm.sqlite3").exists()
    first = manage("erp_sync", "customers", "--full")
    assert "3,000 read, 2,994 upserted (2,994 new, 0 changed), 6 skipped (malformed)" in first
    assert "high-water trans_id 30000" in first
    again = manage("erp_sync", "customers", "--full")
    assert "3,000 read, 2,994 upserted (0 new, 0 changed), 6 skipped" in again

    day = str(recent_day())
    sales = manage("erp_sync", "sales", "--store", "001", "--from", day)
    assert "sales 001: 24 read, 24 upserted (24 new, 0 changed)" in sales
    assert "0 customers created" in sales  # every customer was synced first
    sales_again = manage("erp_sync", "sales", "--store", "001", "--from", day)
    assert "sales 001: 24 read, 24 upserted (0 new, 0 changed)" in sales_again
