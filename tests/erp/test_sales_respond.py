"""The ERP sandbox's own sales respond to WhatsApp messages (the demo's true uplift): customers the
WhatsApp sandbox accepted a message for buy once more at the response rate, the held-out ones
don't, and a campaign whose sales the ERP sync pulls reports that lift. Real PostgreSQL, Redis,
RQ workers, the WhatsApp sandbox and the Millennium sandbox on loopback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone

from campaigns import lifecycle, lift
from campaigns.models import Campaign, WhatsappMessage
from crm.models import Customer
from erp import services as erp_services
from integrations.millennium.client import mobile_e164, parse_date
from integrations.models import WhatsappPrice
from project.sandboxes.millennium import MillenniumSandbox
from project.sandboxes.millennium_data import DEFAULT_STORES
from tests.campaigns.conftest import sandbox, whatsapp_number  # noqa: F401 - fixture
from tests.erp.conftest import make_world

RATE = 0.4


def test_the_sandbox_maps_a_phone_back_to_its_customer_in_any_form():
    erp = MillenniumSandbox(customers=3000)
    for i in (0, 1, 10, 11, 2999):
        record = erp._customer(i)
        digits = record["ddd_celular"] + record["celular"]
        assert erp.customer_of_phone(f"+55{digits}") == i
        assert erp.customer_of_phone(digits) == i
    assert erp.customer_of_phone("+5511912345678") in (None, *range(3000))
    assert erp.customer_of_phone("+1 415 555 0100") is None


def test_the_same_messages_give_the_same_response_sales():
    at = datetime(2026, 11, 2, 15, 30, tzinfo=UTC)
    records = [MillenniumSandbox(customers=400)._customer(i) for i in range(400)]
    phones = [mobile_e164(r["ddd_celular"], r["celular"]) for r in records if r["celular"]]

    def responses(seed: int) -> list[dict]:
        with MillenniumSandbox(customers=400, response_rate=RATE, response_seed=seed) as erp:
            for phone in phones:
                erp.messaged(phone, at)
                erp.messaged(phone, at)  # told twice: one response
            return erp.response_sales()

    first = responses(0)
    assert first == responses(0) and first != responses(1)
    assert 0.25 * len(phones) < len(first) < 0.55 * len(phones)  # 40% (± 5 standard deviations)
    assert len({s["pedidov"] for s in first}) == len(first)
    for sale in first:
        assert at + timedelta(hours=1) <= parse_date(sale["data_emissao"]) <= at + timedelta(days=6)
        assert sale["filial"] in DEFAULT_STORES


def test_a_campaigns_treated_customers_buy_more_in_the_erps_own_sales(transactional_db, sandbox, run_jobs):  # noqa: F811
    erp = MillenniumSandbox(
        customers=600, sales_per_day=8, response_rate=RATE, responds_to=sandbox.url
    ).start()
    try:
        world = make_world(erp)
        org, connection = world["org"], world["connection"]
        erp_services.customers_sync(connection=connection, full=True)
        number = whatsapp_number(org, sandbox)
        WhatsappPrice.objects.create(category="marketing", country="*", price="0.07")
        campaign = Campaign.objects.create(
            organization=org,
            name="Oferta",
            whatsapp_number=number,
            template_name="promo_bf",
            control_percent=30,
        )
        lifecycle.campaign_start(campaign=campaign)
        run_jobs()
        rows = WhatsappMessage.objects.filter(campaign=campaign)
        held = set(rows.filter(status="held_out").values_list("customer__erp_id", flat=True))
        sent = set(
            rows.exclude(status="held_out").exclude(sent_at=None).values_list("customer__erp_id", flat=True)
        )
        assert len(held) > 40 and len(sent) > 150

        # The ERP reads the WhatsApp sandbox's messages before answering a sales request: those
        # customers, and only they, respond (later: their sales come when their time does).
        now = timezone.now()
        erp_services.sales_sync(store=world["store"], start=now - timedelta(hours=1), end=now)
        responders = {str(s["cliente"]) for s in erp.response_sales()}
        assert responders and responders <= sent and not responders & held
        assert 0.25 * len(sent) < len(responders) < 0.55 * len(sent)
    finally:
        erp.stop()

    # The same experiment a week ago, as the demo's ERP would have answered it since: the messages
    # (and the held-out would-be sends) eight days back, the ERP told of them, its sales synced.
    week_ago = timezone.now() - timedelta(days=8)
    rows.update(sent_at=week_ago)
    phones = dict(Customer.objects.filter(organization=org).values_list("erp_id", "phone"))
    with MillenniumSandbox(customers=600, sales_per_day=8, response_rate=RATE) as later:
        for erp_id in sent:
            later.messaged(phones[erp_id], week_ago)
        connection.base_url = later.url
        connection.save(update_fields=["base_url"])
        for store in world["stores"]:
            erp_services.sales_sync(store=store, start=week_ago - timedelta(days=1), end=timezone.now())
    report = lift.campaign_lift(campaign=campaign)
    assert report is not None
    assert report["treatment"]["customers"] == len(sent) and report["control"]["customers"] == len(held)
    low, _ = report["buyers_rate_lift_ci95"]
    treated_rate = report["treatment"]["buyers"] / len(sent)
    control_rate = report["control"]["buyers"] / len(held)
    assert treated_rate > control_rate and low > 0 and report["significant"]  # a true lift, detected
