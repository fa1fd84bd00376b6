"""Numbers on pages use the locale's grouping (USE_THOUSAND_SEPARATOR: "1.234.567" in pt-BR), and
an id or a number that a URL, a form value, an HTML attribute or JavaScript reads never does: every
admin page a crawl from the home page reaches (one per URL shape), rendered with every id past
7,654,321 and a crowded desk (amounts and counts of 1,234,567), carries no grouped number in an
attribute or a script, and the lists' counts are grouped."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection

from crm.models import Organization
from project.demo.integrations import DEMO_ACCESS_TOKEN, DEMO_PHONE_NUMBER_IDS
from project.sandboxes.whatsapp import SandboxServer
from tests.browser.crowd import crowd
from tests.crm.crawl import Page, crawl

pytestmark = pytest.mark.django_db

FIRST_ID = 7_654_321  # ids; the crowded counts and amounts are 1,234,567
# An id or a crowded count written with the separator: the ids from 7.654.321, and 1.234.567.
GROUPED = re.compile(r"\b(7\.65[4-9]|1\.234)\.\d{3}\b")
APPS = ("crm", "messaging", "campaigns", "integrations", "erp", "surveys", "runner", "flows")


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


def _crawl(client, start: str) -> tuple[dict[str, list[str]], list[str]]:
    """Each page's machine-read values with a grouped number, and every list's result cells."""
    pages = crawl(client, start)
    assert len(pages) > 40, sorted(pages)  # the crawl reached the lists and their pages
    grouped: dict[str, list[str]] = {}
    cells: list[str] = []
    for url, page in pages.items():
        bad = [value for value in page.machine if GROUPED.search(value)]
        if bad:
            grouped[url] = [re.sub(r"\s+", " ", value)[:200] for value in bad[:5]]
        cells += [f"{url} {cell.strip()}" for cell in page.cells]
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
    home = Page()
    home.feed(client.get("/admin/").content.decode())
    assert not [value for value in home.machine if GROUPED.search(value)]
