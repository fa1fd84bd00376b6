"""Numbers on pages use the locale's grouping (USE_THOUSAND_SEPARATOR: "1.234.567" in pt-BR), and
an id or a number that a URL, a form value, an HTML attribute or JavaScript reads never does: every
admin page a crawl from the home page reaches (one per URL shape), rendered with every id past
7,654,321 and a crowded desk (amounts and counts of 1,234,567), carries no grouped number in an
attribute or a script, and the lists' counts are grouped."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from io import StringIO
from urllib.parse import urljoin, urlsplit

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection

from crm.models import Organization
from project.demo.integrations import DEMO_ACCESS_TOKEN, DEMO_PHONE_NUMBER_IDS
from project.sandboxes.whatsapp import SandboxServer
from tests.browser.crowd import crowd

pytestmark = pytest.mark.django_db

FIRST_ID = 7_654_321  # ids; the crowded counts and amounts are 1,234,567
# An id or a crowded count written with the separator: the ids from 7.654.321, and 1.234.567.
GROUPED = re.compile(r"\b(7\.65[4-9]|1\.234)\.\d{3}\b")
# Attributes that are words for a person, where a grouped number is right.
HUMAN = {"title", "alt", "aria-label", "placeholder", "data-filter-title"}
# Links a crawl must not follow: they end the session or change state on GET (none should).
SKIP = re.compile(r"/(logout|password_change|delete|password)/|/admin/r/|^/admin/jsi18n")
PAGES = 400
APPS = ("crm", "messaging", "campaigns", "integrations", "erp", "surveys", "runner", "flows")


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.machine: list[str] = []  # what a URL, a form or a script reads
        self.cells: list[str] = []  # the text of the lists' result cells
        self._script = False
        self._cell = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and name not in HUMAN:
                self.machine.append(f"<{tag} {name}={value!r}>")
            if name == "href" and value:
                self.links.append(value)
        self._script = tag == "script"
        if tag == "td":
            self._cell += 1
            self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        self._script = False
        if tag == "td" and self._cell:
            self._cell -= 1

    def handle_data(self, data: str) -> None:
        if self._script:
            self.machine.append(f"<script>{data}")
        elif self._cell:
            self.cells[-1] += data


def _ids_past(first: int) -> None:
    """Every sequence of the schema continues from `first` (a sequence is not rolled back)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT format('%%I.%%I', schemaname, sequencename) FROM pg_sequences "
            "WHERE schemaname = current_schema() AND coalesce(last_value, 0) < %s",
            [first],
        )
        for (name,) in cursor.fetchall():
            cursor.execute("SELECT setval(%s::regclass, %s, false)", [name, first])


def _shape(path: str) -> str:
    return re.sub(r"\d+", "N", path)


def _crawl(client, start: str) -> tuple[dict[str, list[str]], list[str]]:
    """Each page's machine-read values with a grouped number, and every list's result cells."""
    seen: set[str] = set()
    queue = [start]
    grouped: dict[str, list[str]] = {}
    cells: list[str] = []
    while queue and len(seen) < PAGES:
        url = queue.pop(0)
        shape = _shape(urlsplit(url).path)
        if shape in seen:
            continue
        seen.add(shape)
        response = client.get(url)
        assert response.status_code in (200, 302), f"{url}: {response.status_code}"
        if response.status_code != 200 or "html" not in response.get("Content-Type", ""):
            continue
        page = _Page()
        page.feed(response.content.decode())
        bad = [value for value in page.machine if GROUPED.search(value)]
        if bad:
            grouped[url] = [re.sub(r"\s+", " ", value)[:200] for value in bad[:5]]
        cells += [f"{url} {cell.strip()}" for cell in page.cells]
        for href in page.links:
            target = urljoin(url, href)
            parts = urlsplit(target)
            if parts.netloc or not parts.path.startswith("/admin/") or SKIP.search(parts.path):
                continue
            if _shape(parts.path) not in seen:
                queue.append(target)
    assert len(seen) > 40, sorted(seen)  # the crawl reached the lists and their pages
    return grouped, cells


def test_ids_past_a_million_carry_no_separator_where_a_machine_reads_them_and_counts_are_grouped(
    client,
) -> None:
    _ids_past(FIRST_ID)
    with SandboxServer(numbers=dict.fromkeys(DEMO_PHONE_NUMBER_IDS, DEMO_ACCESS_TOKEN)) as sandbox:
        call_command("demo", customers=5, graph_url=sandbox.url, stdout=StringIO())
    call_command("demo_campaign", stdout=StringIO())
    org = Organization.objects.get(slug="demo")
    assert org.pk >= FIRST_ID
    labels = [
        (model._meta.app_label, str(model._meta.model_name))
        for model in admin.site._registry
        if model._meta.app_label in APPS and model._meta.managed
    ]
    crowd(labels, org.pk)

    client.force_login(get_user_model().objects.create_superuser("op", password="pw-op-1234567"))
    grouped, cells = _crawl(client, "/admin/")
    assert not grouped, "grouped ids or numbers where a URL, a form or a script reads them:\n" + "\n".join(
        f"{url}: {values}" for url, values in grouped.items()
    )
    numbers = [cell for cell in cells if re.fullmatch(r"\S+ [\d.,]+", cell)]
    assert any(cell.endswith(" 1.234.567") for cell in numbers), numbers[:50]  # a crowded count, grouped
    ungrouped = [cell for cell in numbers if re.fullmatch(r"\S+ \d{4,}", cell)]
    assert not [cell for cell in ungrouped if int(cell.split()[1]) < FIRST_ID], ungrouped  # ids may be

    manager = get_user_model().objects.get(username="demo-manager")
    client.force_login(manager)
    home = _Page()
    home.feed(client.get("/admin/").content.decode())
    assert not [value for value in home.machine if GROUPED.search(value)]
