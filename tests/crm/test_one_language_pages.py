"""One language on every page a manager reads: the demo manager's crawl of the admin in pt-BR shows
no English word of the product's (a word its catalogues know only in English) and no raw value of
a provider (MARKETING, UTILITY: Meta's names) where a label belongs."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import django
import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from project.demo.integrations import DEMO_ACCESS_TOKEN, DEMO_PHONE_NUMBER_IDS
from project.sandboxes.whatsapp import SandboxServer
from tests.conftest import ROOT
from tests.crm.crawl import crawl
from tests.crm.test_translations import CATALOGUE, SAME_IN_PORTUGUESE

pytestmark = pytest.mark.django_db

# Acronyms and names written in capitals, the same in both languages.
ACRONYMS = {"HTML", "MJML", "JSON", "SMTP", "STARTTLS", "CNPJ", "HMAC", "LGPD", "HTTP", "HTTPS", "WABA"}
# The demo's own names with English words (a flow's key, the "Loja online" store): data.
DEMO_NAMES = {"birthday", "online"}

PUNCTUATION = ".,;:!?()[]«»“”\"'\u203a·|"  # the breadcrumbs: \u203a
WORD = re.compile(r"[^\W\d_]+")
DJANGO = Path(django.__file__).parent


def _catalogue_words(po: Path) -> tuple[set[str], set[str]]:
    """(words of the msgids, words of the msgstrs) of a .po file, lower-cased."""
    english: set[str] = set()
    portuguese: set[str] = set()
    target = english
    for line in po.read_text(encoding="utf-8").splitlines():
        if line.startswith("msgid"):
            target = english
        elif line.startswith("msgstr"):
            target = portuguese
        elif not line.startswith('"'):
            continue
        text = re.sub(r"%\(\w+\)\w|\{\{.*?\}\}|\{%.*?%\}", " ", line.partition('"')[2])
        target.update(w.lower() for w in WORD.findall(text))
    return english, portuguese


def english_only_words() -> set[str]:
    """Words the product's and Django's catalogues use in English and never in Portuguese."""
    english: set[str] = set()
    portuguese: set[str] = set()
    catalogues = [
        ROOT / CATALOGUE,
        *DJANGO.glob("**/locale/pt_BR/LC_MESSAGES/django.po"),
    ]
    for po in catalogues:
        en, pt = _catalogue_words(po)
        english |= en
        portuguese |= pt
    return {w for w in english - portuguese if len(w) > 2}


def _foreign(text: str, vocabulary: set[str]) -> list[str]:
    """The words of `text` a pt-BR page must not show: English words of the catalogues, and raw
    upper-case values (MARKETING) that are not acronyms. A token with inner punctuation or digits is
    an identifier (a slug, a username, an address, an ERP code) and is data."""
    found = []
    for token in text.split():
        word = token.strip(PUNCTUATION)
        if not word or re.search(r"[\d\-_/.@{}=]", word):
            continue
        if (word.lower() in vocabulary and word.lower() not in SAME_IN_PORTUGUESE | DEMO_NAMES) or (
            re.fullmatch(r"[A-Z]{4,}", word) and word not in ACRONYMS
        ):
            found.append(word)
    return found


def _a_day_of_work() -> None:
    """What a day leaves on the desk: every customer skipped by the 24-hour rule (a reason stored
    in English), and a job run completed."""
    from campaigns.caps import SENT_WITHIN_24H
    from campaigns.models import Campaign, WhatsappMessage
    from crm.models import Customer, JobRun

    campaign = Campaign.objects.filter(organization__slug="demo").first()
    assert campaign is not None
    WhatsappMessage.objects.bulk_create(
        WhatsappMessage(
            campaign=campaign,
            organization_id=customer.organization_id,
            customer=customer,
            phone=customer.phone,
            status=WhatsappMessage.Status.SKIPPED,
            error_reason=SENT_WITHIN_24H,
        )
        for customer in Customer.objects.filter(organization=campaign.organization)
    )
    JobRun.objects.create(
        kind="erp-customers", key="demo", organization=campaign.organization, status=JobRun.Status.COMPLETED
    )


def test_a_manager_reads_every_page_in_portuguese(client) -> None:
    with SandboxServer(numbers=dict.fromkeys(DEMO_PHONE_NUMBER_IDS, DEMO_ACCESS_TOKEN)) as sandbox:
        call_command("demo", customers=5, graph_url=sandbox.url, stdout=StringIO())
    call_command("demo_campaign", stdout=StringIO())
    _a_day_of_work()
    client.force_login(get_user_model().objects.get(username="demo-manager"))
    pages = crawl(client, "/admin/", refused=[], HTTP_ACCEPT_LANGUAGE="pt-br")
    assert len(pages) > 40, sorted(pages)  # the lists, their pages and the forms
    assert "/admin/integrations/whatsapptemplate/" in pages  # the templates the demo synced
    vocabulary = english_only_words()
    foreign: dict[str, set[str]] = {}
    for url, page in pages.items():
        for text in page.words:
            if text.startswith(("[{", '{"')):
                continue  # a provider's record as it sent it (the template's components)
            for word in _foreign(text, vocabulary):
                foreign.setdefault(word, set()).add(f"{url}: {text[:80]}")
    assert not foreign, "English on pt-BR pages:\n" + "\n".join(
        f"{word}: {sorted(where)[:3]}" for word, where in sorted(foreign.items())
    )
