"""One language: every string the product marks for translation (Python and templates) has a pt-BR
translation in locale/, none fuzzy. `makemessages` runs on a copy of the product's sources, so the
catalogue in the tree is never rewritten by a test."""

from __future__ import annotations

import re
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


# Words Brazilian Portuguese uses as they are: names, acronyms and the trade's loanwords.
SAME_IN_PORTUGUESE = {
    "whatsapp", "chatwoot", "mjml", "html", "crm", "erp", "cpf", "cnpj", "trans_id", "starttls", "dlq",
    "nps", "id", "status", "total", "cron", "marketing", "webhook", "manual", "incremental", "traceback",
    "job", "jobs", "workers",
}  # fmt: skip


def _pairs(po: Path) -> list[tuple[str, str]]:
    """(msgid, msgstr) of the catalogue's translated entries, each on one line."""
    out = subprocess.run(
        ["msgattrib", "--translated", "--no-obsolete", "--no-wrap", str(po)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return re.findall(r'^msgid "(.+)"\nmsgstr "(.*)"$', out, flags=re.MULTILINE)


def test_no_translation_is_the_english_word_itself() -> None:
    """A msgstr equal to its msgid ("handlers": "handlers") is English on a pt-BR page, unless its
    words are names, acronyms or words Portuguese uses as they are (SAME_IN_PORTUGUESE)."""
    placeholders = re.compile(r"%\(\w+\)\w|%\w|\{\{.*?\}\}")
    same = [
        msgid
        for msgid, msgstr in _pairs(ROOT / CATALOGUE)
        if msgid == msgstr
        and {w.lower() for w in re.findall(r"[^\W\d]{2,}", placeholders.sub("", msgid))} - SAME_IN_PORTUGUESE
    ]
    assert same == []
