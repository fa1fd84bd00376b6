"""The docs' tables that mirror code (settings, queues, commands) and the size of the two front docs: a
setting, queue or command added without its row, or a row left for one that is gone, fails here."""

from __future__ import annotations

import re
from pathlib import Path

from runner import conf as runner_conf

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "configuration.md"
READ = re.compile(r'(?:env\.\w+|_required)\(\s*"([A-Z][A-Z0-9_]+)"')
# Read through `services.login_from_environment(prefix=...)` by `up` and `demo`.
LOGINS = {"ADMIN_USERNAME", "ADMIN_PASSWORD", "DEMO_MANAGER_USERNAME", "DEMO_MANAGER_PASSWORD"}


def _read_by_code() -> set[str]:
    names = set(READ.findall((ROOT / "crm" / "settings.py").read_text(encoding="utf-8")))
    return names | set(runner_conf.DEFAULTS) | LOGINS


def _documented() -> set[str]:
    names: set[str] = set()
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split(" | ")[0]))
    return names


def test_every_setting_the_code_reads_has_its_row() -> None:
    missing = sorted(_read_by_code() - _documented())
    assert not missing, f"settings read but not in docs/configuration.md: {missing}"


def test_every_row_names_a_setting_the_code_reads() -> None:
    stale = sorted(_documented() - _read_by_code())
    assert not stale, f"docs/configuration.md documents settings nothing reads: {stale}"


def test_the_queue_table_lists_every_queue_in_worker_order_with_its_attempts() -> None:
    from crm.queues import QUEUES

    text = (ROOT / "docs" / "queue-platform.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (\d+)(?: \((\d+) s\))? \|", text, flags=re.M)
    documented = [(name, int(attempts), int(backoff or 0)) for name, attempts, backoff in rows]
    expected = [(q.name, q.attempts, q.backoff if q.attempts > 1 else 0) for q in QUEUES]
    assert documented == expected


def _commands_by_code() -> set[str]:
    # Each app's management/commands/NAME.py; a leading underscore marks a shared helper module.
    found = ROOT.glob("*/management/commands/*.py")
    return {path.stem for path in found if not path.stem.startswith("_") and ".venv" not in path.parts}


def _commands_documented() -> set[str]:
    """The command names in docs/operations.md's command table and its stock-RQ-tools section."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    table = text.split("| command | does |", 1)[1].split("\n\n", 1)[0]
    names = {
        m for line in table.splitlines() for m in re.findall(r"`([a-z][a-z0-9_-]*)", line.split(" | ")[0])
    }
    stock = text.split("### Stock RQ tools", 1)[1].split("\n## ", 1)[0]
    return (
        names | set(re.findall(r"manage\.py (rq[a-z-]+)", stock)) | set(re.findall(r"`(rq[a-z-]+)`", stock))
    )


def test_the_command_table_names_every_command_and_only_those() -> None:
    by_code, documented = _commands_by_code(), _commands_documented()
    assert not by_code - documented, (
        f"commands without a row in docs/operations.md: {sorted(by_code - documented)}"
    )
    assert not documented - by_code, (
        f"docs/operations.md names commands that are gone: {sorted(documented - by_code)}"
    )


def test_the_readme_is_a_door_and_the_architecture_a_ten_minute_read() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150
    assert len((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split()) <= 1500
