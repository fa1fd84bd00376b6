"""Every job function path the code enqueues, every cron entry's function and every give-up's path
resolves by dotted path (as RQ and the recovery pass resolve them), and every registered recoverer,
give-up, inbox kind and /metrics collector is a function of a module that imports. A renamed or moved
job function fails here, not on a worker at night."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.utils.module_loading import import_string

from crm import cron, inbox_kinds, prometheus, recovery

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("crm", "messaging", "campaigns", "surveys", "erp", "runner", "integrations", "project")
# Calls whose first argument, or `func=` keyword, names a job function.
JOB_CALLS = {"enqueue", "JobSpec", "CronEntry", "gives_up", "give_up", "cron_register"}


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _dotted(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PACKAGES):
        return node.value if "." in node.value and " " not in node.value else None
    return None


def _names_a_job(node: ast.Assign) -> bool:
    return any(isinstance(t, ast.Name) and t.id.endswith("_FUNC") for t in node.targets)


def _job_paths(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) in JOB_CALLS:
            candidates = [node.args[0] if node.args else None]
            candidates += [k.value for k in node.keywords if k.arg == "func"]
            for candidate in candidates:
                if path := _dotted(candidate):
                    yield node.lineno, path
        elif isinstance(node, ast.Assign) and _names_a_job(node) and (path := _dotted(node.value)):
            yield node.lineno, path


def _product_files() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def test_the_scan_finds_the_job_paths_of_every_app() -> None:
    found = {path for file in _product_files() for _, path in _job_paths(ast.parse(file.read_text()))}
    for app in ("crm", "campaigns", "surveys", "erp", "runner", "integrations"):
        assert any(path.startswith(f"{app}.") for path in found), app


@pytest.mark.parametrize("file", list(_product_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_job_path_in_the_code_resolves(file: Path) -> None:
    for line, path in _job_paths(ast.parse(file.read_text())):
        assert callable(import_string(path)), f"{file.relative_to(ROOT)}:{line}: {path}"


def test_every_cron_entry_resolves() -> None:
    table = cron.cron_table()
    assert table
    for name, entry in table.items():
        assert callable(import_string(entry.func)), f"cron entry {name}: {entry.func}"


def _resolves(fn: object) -> bool:
    """The function is what its module's dotted path names (it would survive a pickle or a restart)."""
    module, qualname = getattr(fn, "__module__", ""), getattr(fn, "__qualname__", "")
    return "<" not in qualname and import_string(f"{module}.{qualname}") is fn


def test_every_recoverer_give_up_inbox_kind_and_collector_resolves() -> None:
    assert recovery._RECOVERERS and recovery._GIVE_UPS
    for name, recoverer in recovery._RECOVERERS.items():
        assert _resolves(recoverer), f"recoverer {name}"
    for func, give_up in recovery._GIVE_UPS.items():
        assert callable(import_string(func)), f"give-up for {func}: the job function does not resolve"
        assert _resolves(give_up), f"give-up for {func}"
    for kind in inbox_kinds.kinds():
        assert _resolves(inbox_kinds._HANDLERS[kind]), f"inbox kind {kind}"
    for name, collector in prometheus._collectors.items():
        assert _resolves(collector), f"collector {name}"
