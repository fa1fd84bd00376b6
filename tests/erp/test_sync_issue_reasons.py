"""Why the ERP sync refused a record is shown in the reader's language: an issue keeps a message id
and its values (not only an English sentence), a manager reads "vendida no futuro: …" and an
operator in English "sold in the future: …"; an issue stored before (English text only) is read
back to its message id, and a text of no known shape is shown as it is."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone, translation
from hypothesis import given
from hypothesis import strategies as st

from crm.models import Membership
from erp import reasons, services
from erp.models import ErpSyncIssue
from erp.upserts import sync_issues_record
from integrations.millennium.client import parse_customer, read_page
from project.sandboxes.millennium import MillenniumSandbox
from project.sandboxes.millennium_data import OFFSET


def _manager_page(org, path: str, language: str) -> str:
    user = get_user_model().objects.create_user(
        f"gerente-{language}", password="pw-gerente-1234", is_staff=True
    )
    Membership.objects.create(user=user, organization=org, role=Membership.Role.MANAGER)
    client = Client(HTTP_ACCEPT_LANGUAGE=language)
    client.force_login(user)
    return client.get(path).content.decode()


def test_a_sale_from_the_future_reads_in_each_readers_language(erp, sandbox_factory):
    org, connection, store = erp["org"], erp["connection"], erp["store"]
    wrong_clock: MillenniumSandbox = sandbox_factory(customers=50, future_sales=True)
    connection.base_url = wrong_clock.url
    connection.save()
    tomorrow = timezone.now().astimezone(OFFSET).date() + timedelta(days=1)
    start = datetime(tomorrow.year, tomorrow.month, tomorrow.day, tzinfo=OFFSET)
    result = services.sales_sync(
        store=store, start=start, end=start + timedelta(days=1), connection=connection
    )
    assert result.future > 0

    issue = ErpSyncIssue.objects.filter(organization=org).first()
    assert issue is not None and issue.reason_code == reasons.SOLD_IN_THE_FUTURE
    assert set(issue.reason_params) == {"sold_at"}
    assert issue.reason.startswith("sold in the future: ")  # the English sentence, kept
    with translation.override("pt-br"):
        assert issue.reason_shown().startswith("vendida no futuro: ")
    with translation.override("en"):
        assert issue.reason_shown() == issue.reason

    portuguese = _manager_page(org, "/admin/erp/erpsyncissue/", "pt-br")
    assert "vendida no futuro: " in portuguese and "sold in the future" not in portuguese
    english = _manager_page(org, "/admin/erp/erpsyncissue/", "en")
    assert "sold in the future: " in english and "vendida no futuro" not in english


def test_a_malformed_record_keeps_its_message_id_and_values(world):
    page = read_page(
        [{"cliente": 7, "trans_id": 3, "data_cadastro": "ontem"}], kind="customer", id_key="cliente",
        parse=parse_customer, trans_id=0,
    )  # fmt: skip
    (malformed,) = page.malformed
    assert malformed.reason == "not a /Date(ms±hhmm)/ value: 'ontem'"
    assert (malformed.reason_code, dict(malformed.reason_params)) == (
        "not a /Date(ms±hhmm)/ value: %(value)s",
        {"value": "'ontem'"},
    )
    sync_issues_record(organization_id=world["org"].pk, issues=page.malformed)
    with translation.override("pt-br"):
        assert ErpSyncIssue.objects.get().reason_shown() == "não é um valor /Date(ms±hhmm)/: 'ontem'"


@pytest.mark.django_db
def test_an_issue_stored_before_reads_in_portuguese_and_seeing_it_again_gives_it_its_id(world):
    org = world["org"]
    old = ErpSyncIssue.objects.create(
        organization=org, kind="sale", external_id="V1", trans_id=9,
        reason="sold in the future: 2026-12-05T10:00:00-03:00 is ahead of the sync's clock", fingerprint="x",
    )  # fmt: skip
    odd = ErpSyncIssue.objects.create(
        organization=org, kind="customer", external_id="C9", reason="something the ERP said", fingerprint="y"
    )
    with translation.override("pt-br"):
        assert old.reason_shown() == (
            "vendida no futuro: 2026-12-05T10:00:00-03:00 está à frente do relógio da sincronização"
        )
        assert odd.reason_shown() == "something the ERP said"
        assert ErpSyncIssue(reason="no cliente").reason_shown() == "sem cliente"


MESSAGES = st.sampled_from(reasons.MESSAGES)
VALUES = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=30)


@given(
    message=MESSAGES,
    values=st.dictionaries(st.sampled_from(["what", "value", "n", "store", "asked", "sold_at"]), VALUES),
)
def test_any_english_reason_reads_back_as_itself_and_each_has_a_translation(message, values):
    params = {name: values.get(name, "x") for name in reasons._PLACEHOLDER.findall(message)}
    english = message % params
    with translation.override("en"):
        assert reasons.reason_text(code="", params={}, english=english) == english
        assert reasons.reason_text(code=message, params=params, english=english) == english
    with translation.override("pt-br"):
        assert translation.gettext(message) != message  # every message id is in the catalogue
        assert (
            reasons.reason_text(code=message, params=params, english=english)
            == translation.gettext(message) % params
        )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("language", "term", "other_term"),
    [
        ("pt-br", "relogio", "NÃO É UMA DATA"),  # accents and case aside
        ("pt-br", "Relógio sincronização", "uma data"),
        ("en", "CLOCK", "not a date"),
        ("en", "ahead sync's", "date:"),
    ],
)
def test_the_list_finds_a_reason_by_the_words_its_reader_sees(world, language, term, other_term):
    """Reasons are stored in English and as message ids, shown translated: the search finds them by
    the words of the list's language too, a new issue by its id, one from before by its sentence."""
    org = world["org"]
    ErpSyncIssue.objects.create(
        organization=org, kind="sale", external_id="NEW", fingerprint="a",
        reason="sold in the future: 2026-12-05T10:00 is ahead of the sync's clock",
        reason_code=reasons.SOLD_IN_THE_FUTURE, reason_params={"sold_at": "2026-12-05T10:00"},
    )  # fmt: skip
    ErpSyncIssue.objects.create(
        organization=org, kind="sale", external_id="OLD", fingerprint="b",
        reason="sold in the future: 2026-11-01T08:00 is ahead of the sync's clock",
    )  # fmt: skip
    ErpSyncIssue.objects.create(
        organization=org, kind="customer", external_id="DATE", fingerprint="c",
        reason="not a date: 'ontem'", reason_code="not a date: %(value)s", reason_params={"value": "'ontem'"},
    )  # fmt: skip
    user = get_user_model().objects.create_user("gerente", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=user, organization=org, role=Membership.Role.MANAGER)
    client = Client(HTTP_ACCEPT_LANGUAGE=language)
    client.force_login(user)

    def found(words: str) -> set[str]:
        response = client.get("/admin/erp/erpsyncissue/", {"q": words})
        return {issue.external_id for issue in response.context["cl"].result_list}

    assert found(term) == {"NEW", "OLD"}
    assert found(other_term) == {"DATE"}
    assert found("DATE") == {"DATE"}  # the ERP id, as before
    assert found(f"{term} ontem") == set()  # every word must match
    assert found("2026-12-05") == {"NEW"}  # a value, in the English sentence
