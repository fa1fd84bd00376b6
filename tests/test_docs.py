"""The docs name code as `dir/file.py` and `dir/file.py:name` (`name` may be `Class.method`), in
backticks or in text pictures: every one must still exist, so a moved module or a renamed function
fails here, not in a reader's search."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
# A path with at least one directory (so `models.py` or `<app>/schedules.py` name no file), and
# the name after a colon without a trailing period.
REFERENCE = re.compile(r"(?<![\w/<>*.-])(\w+(?:/\w+)+\.py)(?::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*))?")


def _assigned(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _defines(body: list[ast.stmt], name: str) -> ast.AST | None:
    """The def, class or assignment of `name` among these statements, if any."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return node
        if name in _assigned(node):
            return node
    return None


def _missing(path: str, name: str | None) -> str | None:
    file = ROOT / path
    if not file.is_file():
        return f"{path}: no such file"
    if name is None:
        return None
    scope: ast.AST | None = ast.parse(file.read_text(encoding="utf-8"))
    for part in name.split("."):
        scope = _defines(getattr(scope, "body", []), part)
        if scope is None:
            return f"{path}:{name}: not defined there"
    return None


def test_every_file_and_function_the_docs_name_exists() -> None:
    references = {m.groups() for doc in DOCS for m in REFERENCE.finditer(doc.read_text(encoding="utf-8"))}
    assert len([r for r in references if r[1]]) > 50  # the "where is it" map is still there
    missing = sorted(filter(None, (_missing(path, name) for path, name in references)))
    assert not missing, "docs name code that is not there:\n" + "\n".join(missing)
