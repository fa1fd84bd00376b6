"""One language: every string the product marks for translation (Python and templates) has a pt-BR
translation in locale/, none fuzzy. `makemessages` runs on a copy of the product's sources, so the
catalogue in the tree is never rewritten by a test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, child_env

PACKAGES = ("crm", "messaging", "campaigns", "integrations", "erp", "surveys", "runner", "flows", "project")
CATALOGUE = Path("locale/pt_BR/LC_MESSAGES/django.po")


def _msgids(po: Path, *flags: str) -> list[str]:
    out = subprocess.run(
        ["msgattrib", *flags, "--no-obsolete", "--no-wrap", str(po)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return [
        line[len('msgid "') : -1]
        for line in out.splitlines()
        if line.startswith('msgid "') and line != 'msgid ""'
    ]


def test_every_marked_string_has_a_pt_br_translation(tmp_path: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "static")
    for name in (*PACKAGES, "templates", "locale"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=ignore)
    shutil.copy(ROOT / "manage.py", tmp_path / "manage.py")
    made = subprocess.run(
        [sys.executable, "manage.py", "makemessages", "-l", "pt_BR", "--no-obsolete", "--no-wrap"],
        cwd=tmp_path,
        env=child_env(PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    po = tmp_path / CATALOGUE
    assert _msgids(po, "--untranslated") == []
    # A fuzzy entry is a guess makemessages made for a new string from a similar one: untranslated
    # (unless only its format flag is new: a literal "95%" read as a format, translated all the same).
    translated = set(_msgids(ROOT / CATALOGUE, "--translated"))
    assert [msgid for msgid in _msgids(po, "--only-fuzzy") if msgid not in translated] == []
