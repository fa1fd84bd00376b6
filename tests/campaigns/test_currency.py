"""Every price and cost carries its currency: WhatsApp is priced in the rate card's (US dollars),
never shown as reais; totals never add two currencies; an organization's conversion rate shows
its own currency as an estimate. Sent for real through the Meta sandbox and RQ workers."""

from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import translation
from hypothesis import given
from hypothesis import strategies as st

from campaigns import lifecycle, selectors
from campaigns.models import CampaignMetric, WhatsappMessage
from crm.money import cost_estimate
from integrations.models import WhatsappPrice
from integrations.whatsapp.pricing import parse_rate_card

# Every key campaign_status --json had before the currency: operators' scripts read them.
KEYS = {
    "id",
    "name",
    "channel",
    "status",
    "status_label",
    "counts",
    "total",
    "progress",
    "processed",
    "reached",
    "cost",
    "cost_display",
    "rate",
    "eta_seconds",
    "stop_reason",
    "sending_paused",
    "revenue",
    "conversions",
}


def _status(campaign_id: int) -> dict:
    out = StringIO()
    with translation.override("pt-br"):
        call_command("campaign_status", str(campaign_id), "--json", stdout=out)
    return json.loads(out.getvalue())


def test_a_whatsapp_cost_is_in_the_rate_cards_currency_everywhere(wa, run_jobs):
    wa["customers"](4)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    data = _status(campaign.pk)
    assert set(data) >= KEYS
    assert data["cost_currency"] == "USD"
    assert Decimal(data["cost"]) == Decimal("0.0625") * 4
    assert "US$" in data["cost_display"] and "R$" not in data["cost_display"]
    assert data["cost_estimate"] is None  # no conversion rate: no reais shown at all
    assert set(WhatsappMessage.objects.filter(campaign=campaign).values_list("cost_currency", flat=True)) == {
        "USD"
    }
    # Revenue is in reais and the cost in dollars: no ratio without a rate.
    assert selectors.campaign_attribution(campaign_id=campaign.pk).revenue_per_cost is None


def test_an_organizations_rate_shows_its_currency_labelled_as_an_estimate(wa, run_jobs):
    org = wa["org"]
    org.cost_conversion_rate = Decimal("5.40")
    org.cost_conversion_currency = "USD"
    org.save()
    wa["customers"](4)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    data = _status(campaign.pk)
    assert data["cost_currency"] == "USD"
    assert Decimal(data["cost_estimate"]) == (Decimal("0.25") * Decimal("5.40")).quantize(Decimal("0.01"))
    assert "US$" in data["cost_display"] and "R$" in data["cost_display"]
    assert "estimativa" in data["cost_display"]
    figures = selectors.campaign_attribution(campaign_id=campaign.pk)
    assert figures.revenue_per_cost is None and figures.cost_estimate == Decimal("0.25") * Decimal("5.40")


def test_prices_in_another_currency_never_add_to_a_campaigns_total(wa, run_jobs):
    wa["customers"](3)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())  # its total is in USD, the card's
    # The card is replaced by one in reais before the sends: a real sum would mix the two.
    WhatsappPrice.objects.update(currency="BRL", price=Decimal("0.35"))
    run_jobs()
    metric = CampaignMetric.objects.get(campaign=campaign)
    assert (metric.sent, metric.cost, metric.cost_currency) == (3, Decimal("0"), "USD")
    assert _status(campaign.pk)["cost_currency"] == "USD"


@pytest.mark.parametrize(
    ("card", "currencies"),
    [
        ("country,category,price,currency\nBR,marketing,0.0625,USD\n*,marketing,0.07,USD\n", {"USD"}),
        ("country,category,price,currency\nBR,marketing,0.0625,USD\n*,marketing,0.35,BRL\n", {"USD"}),
        ("country,category,price,currency\nBR,marketing,0.0625,US DOLLAR\n", set()),
    ],
)
def test_a_rate_card_has_one_iso_currency(card, currencies):
    rates, problems = parse_rate_card(card)
    assert {r.currency for r in rates} == currencies
    assert len(rates) + len(problems) == card.count("\n") - 1


@given(
    amount=st.decimals(min_value=0, max_value=10**6, places=4, allow_nan=False),
    currency=st.sampled_from(["USD", "BRL", "EUR"]),
    rate_currency=st.sampled_from(["USD", "EUR"]),
    rate=st.one_of(st.none(), st.decimals(min_value=0, max_value=100, places=4, allow_nan=False)),
)
def test_an_estimate_is_made_only_from_a_rate_for_that_currency(amount, currency, rate_currency, rate):
    estimate = cost_estimate(amount, currency, rate=rate, rate_currency=rate_currency)
    if currency == "BRL":
        assert estimate == amount
    elif rate is None or rate_currency != currency:
        assert estimate is None
    else:
        assert estimate == amount * rate
