"""crm.bulk.update_rows: every row gets exactly its own values, whether a column's values differ
from row to row (one array) or are the same for all of them (sent once), and the compare-and-set
writes only the rows that still hold the expected value."""

from __future__ import annotations

import datetime

from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from crm import bulk
from crm.models import Customer, Organization

texts = st.text(st.characters(exclude_characters="\0", codec="utf-8"), max_size=30)
dates = st.none() | st.dates(datetime.date(1900, 1, 1), datetime.date(2100, 1, 1))
times = st.none() | st.datetimes(
    datetime.datetime(2000, 1, 1), datetime.datetime(2100, 1, 1), timezones=st.just(datetime.UTC)
)


def _column(values: st.SearchStrategy, n: int) -> st.SearchStrategy[list]:
    """n values: all different draws, or one value for every row."""
    return st.lists(values, min_size=n, max_size=n) | values.map(lambda v: [v] * n)


@st.composite
def updates(draw: st.DrawFn) -> tuple[int, dict[str, list]]:
    n = draw(st.integers(1, 12))
    return n, {
        "name": draw(_column(texts, n)),
        "marketing_consent": draw(_column(st.booleans(), n)),
        "birth_date": draw(_column(dates, n)),
        "whatsapp_opted_out_at": draw(_column(times, n)),
    }


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(update=updates(), guarded=st.booleans())
def test_each_row_gets_its_own_values_whatever_repeats(db, update, guarded):
    n, columns = update
    org, _ = Organization.objects.get_or_create(slug="bulk", defaults={"name": "Bulk"})
    Customer.objects.filter(organization=org).delete()
    customers = Customer.objects.bulk_create(
        [Customer(organization=org, name=f"before {i}", email="x@example.com") for i in range(n)]
    )
    moved = customers[0]  # changed by another writer meanwhile: a guarded write leaves it alone
    Customer.objects.filter(pk=moved.pk).update(email="moved@example.com")
    for i, customer in enumerate(customers):
        for name, values in columns.items():
            setattr(customer, name, values[i])
    only_if = {"email": "x@example.com"} if guarded else None
    written = bulk.update_rows(Customer, customers, list(columns), only_if=only_if)
    assert written == (n - 1 if guarded else n)
    back = {row["pk"]: row for row in Customer.objects.filter(organization=org).values("pk", *columns)}
    for i, customer in enumerate(customers):
        if guarded and customer.pk == moved.pk:
            assert back[customer.pk]["name"] == "before 0"
            continue
        assert {name: back[customer.pk][name] for name in columns} == {
            name: values[i] for name, values in columns.items()
        }


def test_a_column_with_one_value_travels_once(db):
    org = Organization.objects.create(name="Loja", slug="loja")
    customers = Customer.objects.bulk_create([Customer(organization=org, name=f"c{i}") for i in range(500)])
    for customer in customers:
        customer.marketing_consent = True
        customer.name = f"renamed {customer.pk}"
    with CaptureQueriesContext(connection) as queries:
        assert bulk.update_rows(Customer, customers, ["marketing_consent", "name"]) == 500
    [statement] = [q["sql"] for q in queries.captured_queries]
    assert '"marketing_consent" = true::boolean' in statement
    assert statement.count("renamed") == 500
    assert Customer.objects.filter(organization=org, marketing_consent=True).count() == 500
