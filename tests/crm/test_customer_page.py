"""The customer's admin page shows the person (purchases, messages by channel, consent history,
segment, survey answers), and its search finds a phone or a CPF however it is typed."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns.models import Campaign, CustomerSegment, EmailMessage, WhatsappMessage
from crm import customer_page, services
from crm.models import ConsentSource, Customer, Membership, Organization, Sale
from surveys.models import Survey

PHONE = "+5511990000000"
CPF = "52998224725"


@pytest.fixture
def person(world) -> Customer:
    org, store = world["org"], world["store"]
    customer = Customer.objects.create(
        organization=org, erp_id="P1", name="Paula Reis", phone=PHONE, cpf_cnpj=CPF, email="paula@example.com"
    )
    sale = Sale.objects.create(
        organization=org,
        store=store,
        customer=customer,
        erp_id="V1",
        total=Decimal("250.00"),
        sold_at=timezone.now() - timedelta(days=2),
    )
    campaign = Campaign.objects.create(organization=org, name="Inverno")
    WhatsappMessage.objects.create(
        campaign=campaign, organization=org, customer=customer, status="delivered", phone=PHONE
    )
    EmailMessage.objects.create(
        campaign=campaign, organization=org, customer=customer, status="bounced", email=customer.email
    )
    services.customers_consent_set(customer_ids=[customer.pk], given=True, source=ConsentSource.ADMIN)
    CustomerSegment.objects.create(
        organization=org,
        day=date(2026, 12, 1),
        customer=customer,
        segment="champions",
        recency_days=2,
        frequency=5,
        monetary=Decimal("900"),
    )
    Survey.objects.update_or_create(
        sale=sale,
        defaults={
            "organization": org,
            "customer": customer,
            "store": store,
            "channel": "email",
            "status": "answered",
            "score": 9,
            "comment": "Ótimo atendimento",
            "due_at": timezone.now(),
            "answered_at": timezone.now(),
        },
    )
    return customer


@pytest.fixture
def manager(world) -> Client:
    user = User.objects.create_user("gerente", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=user, organization=world["org"], role="manager")
    client = Client()
    client.force_login(user)
    return client


def test_the_customers_page_shows_the_person(person, manager, english) -> None:
    page = manager.get(f"/admin/crm/customer/{person.pk}/change/").content.decode()
    for expected in ("Centro", "Inverno", "Ótimo atendimento", "customer-section"):
        assert expected in page, expected
    sections = dict(customer_page.customer_sections(person))
    assert [str(t) for t in sections] == [
        "Purchases",
        "Segment",
        "Messages",
        "WhatsApp conversation",
        "Survey answers",
    ]
    messages = next(html for title, html in sections.items() if str(title) == "Messages")
    assert "WhatsApp" in messages and "delivered" in messages and "bounced" in messages
    # Each consent change reads as what happened and where from, not as its raw fields.
    assert "consent given · recorded in the admin" in page, page[page.find("consent change") :][:2000]


@pytest.mark.parametrize(
    "typed",
    [
        "(11) 99000-0000",
        "11990000000",
        "+55 11 99000-0000",
        "5511990000000",
        "11 9900-0000"[:0] + "011 99000 0000",
    ],
)
def test_a_phone_is_found_however_it_is_typed(person, manager, typed) -> None:
    response = manager.get("/admin/crm/customer/", {"q": typed})
    assert list(response.context["cl"].result_list) == [person]


@pytest.mark.parametrize("typed", ["529.982.247-25", "52998224725", " 529 982 247 25 "])
def test_a_cpf_is_found_with_or_without_punctuation(person, manager, typed) -> None:
    response = manager.get("/admin/crm/customer/", {"q": typed})
    assert list(response.context["cl"].result_list) == [person]


def test_another_organizations_customer_is_not_found_by_number(person, manager) -> None:
    other = Organization.objects.create(name="Outra", slug="outra")
    Customer.objects.create(organization=other, erp_id="O1", name="Outro", phone=PHONE)
    response = manager.get("/admin/crm/customer/", {"q": "(11) 99000-0000"})
    assert list(response.context["cl"].result_list) == [person]


def test_the_number_search_probes_the_indexes(person) -> None:
    org = person.organization_id
    Customer.objects.bulk_create(
        Customer(
            organization_id=org,
            erp_id=f"B{i}",
            name=f"C{i}",
            phone=f"+55119{70000000 + i:08d}",
            cpf_cnpj=f"{i:011d}",
        )
        for i in range(5000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE crm_customer")
    with CaptureQueriesContext(connection) as queries:
        found = list(
            customer_page.number_search(Customer.objects.all(), "11990000000", organization_ids=[org])
        )
    assert found == [person]
    with connection.cursor() as cursor:
        plans = []
        for query in queries.captured_queries[:2]:
            cursor.execute("EXPLAIN " + query["sql"])
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    assert "customer_org_cpf_cnpj" in plans[0] and "customer_org_phone" in plans[1], plans


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="0123456789+()-./ abc", max_size=30))
def test_any_typed_search_term_finds_only_matching_customers(person, term) -> None:
    with CaptureQueriesContext(connection):
        if customer_page.looks_like_number(term):
            found = list(
                customer_page.number_search(
                    Customer.objects.all(), term, organization_ids=[person.organization_id]
                )
            )
            assert all(c.phone == PHONE or c.cpf_cnpj == CPF for c in found)
