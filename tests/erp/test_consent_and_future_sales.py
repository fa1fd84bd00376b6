"""Lawful and true, through a real Millennium sandbox on loopback: consent comes only from the ERP's
opt-in field (never by default), and a sale stamped in the future is refused, counted and never
credited to a campaign."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone, translation
from hypothesis import given
from hypothesis import strategies as st

from campaigns.models import Campaign, SaleAttribution, WhatsappMessage
from crm.models import ConsentChange, ConsentSource, Customer, Sale
from crm.services import customers_consent_set
from erp import services
from erp.models import ErpSyncIssue
from integrations.millennium.client import OPT_IN_FIELD, parse_opt_in
from project.sandboxes.millennium import MillenniumSandbox
from project.sandboxes.millennium_data import OFFSET


def _customer(org, i: int) -> Customer:
    return Customer.objects.get(organization=org, erp_id=str(1000 + i))


def test_a_customer_synced_without_an_opt_in_has_no_consent_and_one_with_it_keeps_its_source(erp):
    org, connection, sandbox = erp["org"], erp["connection"], erp["sandbox"]
    assert OPT_IN_FIELD not in sandbox.customer_record(12)  # this one was never asked
    assert sandbox.customer_record(4)[OPT_IN_FIELD] is False  # said no
    assert (
        sandbox.customer_record(0)[OPT_IN_FIELD] is True and sandbox.customer_record(1)[OPT_IN_FIELD] == "S"
    )
    before = timezone.now()
    services.customers_sync(connection=connection, full=True)

    never_asked, said_no = _customer(org, 12), _customer(org, 4)
    assert (never_asked.marketing_consent, never_asked.marketing_consent_source) == (False, "")
    assert not never_asked.can_receive_whatsapp and not never_asked.can_receive_email
    assert said_no.marketing_consent is False
    for i in (0, 1):
        yes = _customer(org, i)
        assert (yes.marketing_consent, yes.marketing_consent_source) == (True, ConsentSource.ERP)
        assert yes.consent_at is not None and yes.consent_at >= before
        assert ConsentChange.objects.filter(customer=yes, given=True, source=ConsentSource.ERP).count() == 1
    # Exactly the customers whose record says yes: one in five says no, one in thirteen lacks it.
    expected = sum(1 for i in range(2500) if i % 13 != 12 and i % 5 != 4)
    assert Customer.objects.filter(organization=org, marketing_consent=True).count() == expected
    # A second sync writes no new history.
    changes = ConsentChange.objects.count()
    services.customers_sync(connection=connection, full=True)
    assert ConsentChange.objects.count() == changes


def test_an_erp_no_withdraws_what_the_erp_or_the_old_default_gave_never_a_forms(erp):
    org, connection, sandbox = erp["org"], erp["connection"], erp["sandbox"]
    services.customers_sync(connection=connection, full=True)
    form, legacy = _customer(org, 4), _customer(org, 9)  # the ERP says no to both
    customers_consent_set(customer_ids=[form.pk], given=True, source=ConsentSource.FORM)
    Customer.objects.filter(pk=legacy.pk).update(marketing_consent=True, marketing_consent_source="legacy")
    sandbox.touch_customers([4, 9])
    services.customers_sync(connection=connection, full=False)
    form.refresh_from_db()
    legacy.refresh_from_db()
    assert (form.marketing_consent, form.marketing_consent_source) == (True, ConsentSource.FORM)
    assert (legacy.marketing_consent, legacy.marketing_consent_source) == (False, ConsentSource.ERP)


def test_a_placeholder_customer_of_a_synced_sale_has_no_consent(erp):
    org, connection, store = erp["org"], erp["connection"], erp["store"]
    now = timezone.now().astimezone(OFFSET)
    start = datetime(now.year, now.month, now.day, tzinfo=OFFSET) - timedelta(days=2)
    services.sales_sync(store=store, start=start, end=start + timedelta(days=1), connection=connection)
    placeholders = Customer.objects.filter(organization=org, name="")
    assert placeholders.exists()
    assert not placeholders.filter(marketing_consent=True).exists()


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.floats(allow_nan=True)))
def test_the_opt_in_is_true_only_for_an_unambiguous_yes(value):
    answer = parse_opt_in(value)
    assert answer in (True, False, None)
    if answer is True:
        assert (
            value is True
            or value == 1
            or str(value).strip().lower() in {"s", "sim", "y", "yes", "true", "t", "1"}
        )


def test_the_sandbox_serves_no_sale_before_its_time(erp):
    connection, store, sandbox = erp["connection"], erp["store"], erp["sandbox"]
    tomorrow = timezone.now().astimezone(OFFSET).date() + timedelta(days=1)
    start = datetime(tomorrow.year, tomorrow.month, tomorrow.day, tzinfo=OFFSET)
    assert sandbox.sales_of_day(store.erp_code, tomorrow)  # the day has sales, once it comes
    result = services.sales_sync(
        store=store, start=start, end=start + timedelta(days=1), connection=connection
    )
    assert (result.read, result.future) == (0, 0)


def test_sales_stamped_in_the_future_are_refused_counted_and_never_credited(erp, sandbox_factory):
    org, connection, store = erp["org"], erp["connection"], erp["store"]
    wrong_clock: MillenniumSandbox = sandbox_factory(customers=2500, future_sales=True)
    connection.base_url = wrong_clock.url
    connection.save()
    services.customers_sync(connection=connection, full=True)
    tomorrow = timezone.now().astimezone(OFFSET).date() + timedelta(days=1)
    start = datetime(tomorrow.year, tomorrow.month, tomorrow.day, tzinfo=OFFSET)
    served = len(wrong_clock.sales_of_day(store.erp_code, tomorrow))
    # Every customer had a campaign message an hour ago: a stored future sale would be credited.
    campaign = Campaign.objects.create(organization=org, name="Promo", status=Campaign.Status.SENT)
    sent_at = timezone.now() - timedelta(hours=1)
    WhatsappMessage.objects.bulk_create(
        WhatsappMessage(
            campaign=campaign,
            organization=org,
            customer_id=pk,
            status=WhatsappMessage.Status.DELIVERED,
            sent_at=sent_at,
        )
        for pk in Customer.objects.filter(organization=org).values_list("pk", flat=True)
    )

    result = services.sales_sync(
        store=store, start=start, end=start + timedelta(days=1), connection=connection
    )

    assert served > 0 and result.read == served
    assert (result.future, result.created, result.attributed) == (served, 0, 0)
    with translation.override("en"):
        assert "refused (sold in the future)" in result.summary()
    assert result.as_dict()["future"] == served  # what the job run keeps
    assert not Sale.objects.filter(organization=org).exists()
    issues = ErpSyncIssue.objects.filter(organization=org, reason__startswith="sold in the future")
    assert issues.count() == served

    # Attribution refuses a future sale whatever wrote it (here the ORM, as the admin would).
    customer = Customer.objects.filter(organization=org).first()
    future = Sale.objects.create(
        organization=org,
        store=store,
        customer=customer,
        erp_id="F-1",
        total=Decimal("99.90"),
        sold_at=timezone.now() + timedelta(hours=3),
    )
    present = Sale.objects.create(
        organization=org,
        store=store,
        customer=customer,
        erp_id="P-1",
        total=Decimal("49.90"),
        sold_at=timezone.now(),
    )
    assert not SaleAttribution.objects.filter(sale=future).exists()
    assert SaleAttribution.objects.filter(sale=present, campaign=campaign).exists()
