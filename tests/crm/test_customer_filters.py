"""One customer filter (crm.customer_filters) for the customer list and campaign audiences: its terms
combined, its JSON round trip, outside input refused with a named term, never a 500."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns import audience, selectors
from campaigns.models import Campaign, CustomerSegment
from crm.customer_filters import CustomerFilter, customers_filtered
from crm.models import Customer, Membership, Organization, Sale, Store


@pytest.fixture
def shop(db) -> dict:
    """Four consenting customers: Ana bought twice at Centro (R$ 300 in all, last 10 days ago,
    born in March), Bia once at Norte (R$ 50, 40 days ago), Caio never, Davi without consent."""
    org = Organization.objects.create(name="Loja", slug="loja")
    centro = Store.objects.create(organization=org, erp_code="1", name="Centro")
    norte = Store.objects.create(organization=org, erp_code="2", name="Norte")

    def person(name: str, **fields) -> Customer:
        return Customer.objects.create(
            organization=org,
            name=name,
            phone=f"+55119{abs(hash(name)) % 10**8:08d}",
            email=f"{name.lower()}@example.com.br",
            marketing_consent=fields.pop("consent", True),
            **fields,
        )

    ana = person("Ana", birth_date=date(1990, 3, 14))
    bia, caio, davi = person("Bia"), person("Caio"), person("Davi", consent=False)
    now = timezone.now()
    for i, (who, store, total, days) in enumerate(
        [(ana, centro, "100", 30), (ana, centro, "200", 10), (bia, norte, "50", 40)]
    ):
        Sale.objects.create(
            organization=org,
            store=store,
            customer=who,
            erp_id=f"S{i}",
            total=Decimal(total),
            sold_at=now - timedelta(days=days),
        )
    return {"org": org, "centro": centro, "ana": ana, "bia": bia, "caio": caio, "davi": davi}


def _names(org: Organization, **terms) -> set[str]:
    qs = customers_filtered(organization_id=org.pk, customer_filter=CustomerFilter(**terms))
    return set(qs.values_list("name", flat=True))


def test_each_term_and_their_combination_select_the_right_customers(shop):
    org, today = shop["org"], timezone.localdate()
    assert _names(org) == {"Ana", "Bia", "Caio", "Davi"}
    assert _names(org, store_id=shop["centro"].pk) == {"Ana"}
    assert _names(org, purchases_min=1) == {"Ana", "Bia"}
    assert _names(org, purchases_max=1) == {"Bia", "Caio", "Davi"}  # never bought: 0 purchases
    assert _names(org, spent_min=Decimal("100")) == {"Ana"}
    assert _names(org, last_purchase_from=today - timedelta(days=20)) == {"Ana"}
    assert _names(org, last_purchase_to=today - timedelta(days=20)) == {"Bia"}
    assert _names(org, birthday_month=3) == {"Ana"}
    assert _names(org, consent_channel="whatsapp") == {"Ana", "Bia", "Caio"}
    assert _names(org, purchases_min=1, spent_max=Decimal("60"), consent_channel="email") == {"Bia"}


def test_the_segment_term_reads_the_latest_snapshot(shop):
    org = shop["org"]
    assert _names(org, segment="champions") == set()
    CustomerSegment.objects.create(
        organization=org,
        customer=shop["ana"],
        day=timezone.localdate(),
        segment="champions",
        recency_days=10,
        frequency=2,
        monetary=300,
    )
    assert _names(org, segment="champions") == {"Ana"}


def test_a_campaign_audience_is_narrowed_by_its_filter_and_the_preview_counts_it(shop):
    campaign = Campaign.objects.create(
        organization=shop["org"],
        name="Aniversariantes",
        channel="email",
        email_subject="Parabéns",
        email_body="<p>Oi</p>",
        audience_filter=CustomerFilter(birthday_month=3).to_json(),
    )
    assert list(selectors.campaign_audience(campaign=campaign)) == [shop["ana"]]
    assert audience.audience_preview(campaign=campaign).receives == 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "store_id",
                "last_purchase_from",
                "purchases_min",
                "spent_min",
                "birthday_month",
                "consent_channel",
            ]
        ),
        st.one_of(st.text(max_size=12), st.integers(min_value=-(10**6), max_value=10**6)),
    )
)
def test_outside_input_is_read_or_refused_naming_the_term(data):
    try:
        terms = CustomerFilter.from_json(data)
    except ValueError as exc:
        assert str(exc).split(":")[0] in data
    else:
        assert CustomerFilter.from_json(terms.to_json()) == terms


def test_the_json_round_trip_keeps_every_term():
    terms = CustomerFilter(
        store_id=3,
        last_purchase_from=date(2026, 1, 1),
        last_purchase_to=date(2026, 2, 1),
        purchases_min=2,
        spent_max=Decimal("99.90"),
        segment="at_risk",
        birthday_month=12,
        consent_channel="email",
    )
    assert CustomerFilter.from_json(terms.to_json()) == terms
    assert CustomerFilter().is_empty() and not terms.is_empty()


def test_the_customer_list_filters_with_the_same_terms_and_refuses_bad_input(shop):
    user = get_user_model().objects.create_user("gerente", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=user, organization=shop["org"], role=Membership.Role.MANAGER)
    client = Client(HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(user)
    page = client.get("/admin/crm/customer/", {"cf_purchases_min": "1", "cf_consent_channel": "whatsapp"})
    body = page.content.decode()
    assert page.status_code == 200 and 'id="customer-filter"' in body
    assert "Ana" in body and "Bia" in body and "Caio" not in body
    bad = client.get("/admin/crm/customer/", {"cf_birthday_month": "13"})
    assert bad.status_code in (200, 302) and bad.status_code != 500


def test_a_manager_picks_the_store_by_its_name_on_the_customer_list(shop):
    user = get_user_model().objects.create_user("gerente", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=user, organization=shop["org"], role=Membership.Role.MANAGER)
    other = Organization.objects.create(name="Outra", slug="outra")
    Store.objects.create(organization=other, erp_code="9", name="Loja de outra organização")
    client = Client()
    client.force_login(user)
    body = client.get("/admin/crm/customer/").content.decode()
    centro = shop["centro"].pk
    assert '<select name="cf_store_id"' in body and f'<option value="{centro}">Centro</option>' in body
    assert "Norte</option>" in body and "Loja de outra organização" not in body
    assert "comprou na loja</label>" in body  # no id to type
    page = client.get("/admin/crm/customer/", {"cf_store_id": str(centro)}).content.decode()
    assert "Ana" in page and "Bia" not in page
