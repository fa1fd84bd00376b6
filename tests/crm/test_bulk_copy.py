"""crm.bulk.copy_rows: rows written with PostgreSQL's COPY come back exactly as given, the other
fields get their defaults, and conflicts are either left out or refuse the whole write."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from crm import bulk
from crm.models import Customer, Organization

AWKWARD = [
    "",
    "plain",
    'O\'Brien "the" `quoted`',
    "tab\there\tand\tthere",
    "line\nbreak\r\nand CR\r",
    "back\\slash \\\\ double \\t not a tab \\n not a newline",
    "\\N",  # COPY's NULL marker, as text: must stay two characters
    "\\.",  # COPY's end-of-data marker
    "São Paulo \u2013 ação, coração, Ñandú",
    "emoji 👍🏽 and \U0001d518\U0001d52b (astral plane), e\u0301 combined, \u200b zero-width, \u202eRTL",
    "中文 日本語 한국어 العربية עברית",
    "\x01\x02\x1b control characters\x7f",
    " leading and trailing spaces ",
    "comma, separated; values|pipes",
]


def test_awkward_text_and_nulls_round_trip_exactly(db):
    org = Organization.objects.create(name="Loja", slug="loja")
    rows = [(org.pk, f"A{i}", name, "") for i, name in enumerate(AWKWARD)]
    rows += [(org.pk, None, "no ERP id", ""), (org.pk, "\\N", "ERP id is the NULL marker", "\\N")]
    assert bulk.copy_rows(Customer, ["organization_id", "erp_id", "name", "cpf_cnpj"], rows) == len(rows)
    back = list(
        Customer.objects.filter(organization=org).order_by("pk").values_list("erp_id", "name", "cpf_cnpj")
    )
    assert back == [(erp_id, name, cpf) for _, erp_id, name, cpf in rows]
    assert Customer.objects.filter(organization=org, erp_id__isnull=True).count() == 1


def test_fields_not_given_get_their_defaults(db):
    org = Organization.objects.create(name="Loja", slug="loja")
    bulk.copy_rows(Customer, ["organization_id", "name"], [(org.pk, "Ana"), (org.pk, "Bia")])
    ana, bia = Customer.objects.filter(organization=org).order_by("pk")
    assert (ana.erp_id, ana.email, ana.phone, ana.marketing_consent, ana.erp_trans_id) == (
        None,
        "",
        "",
        False,  # consent is never assumed: the model default
        None,
    )
    assert ana.created_at and ana.updated_at and bia.created_at >= ana.created_at


def test_ignore_conflicts_writes_only_the_new_rows_and_leaves_the_others_alone(db):
    org = Organization.objects.create(name="Loja", slug="loja")
    fields = ["organization_id", "erp_id", "name"]
    assert bulk.copy_rows(Customer, fields, [(org.pk, f"E{i}", f"first {i}") for i in range(3)]) == 3
    again = [(org.pk, f"E{i}", f"second {i}") for i in range(5)]
    assert bulk.copy_rows(Customer, fields, again, ignore_conflicts=True) == 2
    assert bulk.copy_rows(Customer, fields, again, ignore_conflicts=True) == 0  # and again: nothing left over
    names = dict(Customer.objects.filter(organization=org).values_list("erp_id", "name"))
    assert names == {"E0": "first 0", "E1": "first 1", "E2": "first 2", "E3": "second 3", "E4": "second 4"}


def test_a_conflict_without_ignore_conflicts_writes_none_of_the_rows(db):
    org = Organization.objects.create(name="Loja", slug="loja")
    fields = ["organization_id", "erp_id", "name"]
    bulk.copy_rows(Customer, fields, [(org.pk, "E1", "first")])
    with pytest.raises(IntegrityError), transaction.atomic():
        bulk.copy_rows(
            Customer, fields, [(org.pk, "E0", "new"), (org.pk, "E1", "duplicate"), (org.pk, "E2", "new")]
        )
    assert list(Customer.objects.filter(organization=org).values_list("erp_id", "name")) == [("E1", "first")]


def test_insert_select_writes_the_rows_a_query_makes_with_the_other_fields_defaults(db):
    org = Organization.objects.create(name="Loja", slug="loja")
    bulk.copy_rows(
        Customer, ["organization_id", "erp_id", "name"], [(org.pk, f"E{i}", f"ana {i}") for i in range(3)]
    )
    fields = ["organization_id", "erp_id", "name", "created_at"]
    made = (
        "SELECT organization_id, 'copy-' || erp_id, upper(name), now() FROM crm_customer "
        "WHERE organization_id = %s AND erp_id < %s"  # E0, E1 (not E2, nor a copy)
    )
    sql, params = bulk.insert_select(Customer, fields, made, ignore_conflicts=True)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, org.pk, "E2"])  # its own parameters before the query's
        assert cursor.rowcount == 2
        cursor.execute(sql, [*params, org.pk, "E2"])  # conflicts left out
        assert cursor.rowcount == 0
    copies = Customer.objects.filter(organization=org, erp_id__startswith="copy-").order_by("erp_id")
    assert [(c.erp_id, c.name) for c in copies] == [("copy-E0", "ANA 0"), ("copy-E1", "ANA 1")]
    first = copies[0]
    assert (first.email, first.phone, first.marketing_consent) == ("", "", False) and first.updated_at
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(bulk.insert_select(Customer, fields, made)[0], [*params, org.pk, "E2"])


def test_insert_select_wants_a_callable_default_made_by_the_query(db):
    with pytest.raises(ValueError, match="created_at"):
        bulk.insert_select(Customer, ["organization_id", "name"], "SELECT 1, 'x'")
