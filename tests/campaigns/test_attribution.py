"""Revenue attribution through the real stack: sales saved through the ORM and the admin, the
`attribute` command, campaign_status --json, the campaign page and the organization's dashboard,
and a property test against a pure-Python reference."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from campaigns import attribution
from campaigns.models import (
    Campaign,
    CampaignMetric,
    CampaignRevenue,
    Channel,
    EmailMessage,
    SaleAttribution,
    WhatsappMessage,
)
from crm.models import Customer, Organization, Sale, Store

T0 = datetime(2026, 11, 2, 15, 0, tzinfo=UTC)
WINDOW = timedelta(days=7)


def _campaign(org: Organization, name: str, channel: str = Channel.WHATSAPP) -> Campaign:
    return Campaign.objects.create(
        organization=org, name=name, channel=channel, status=Campaign.Status.SENT, started_at=T0
    )


def _sent(campaign: Campaign, customer: Customer, at: datetime, status: str = "sent"):
    model = EmailMessage if campaign.channel == Channel.EMAIL else WhatsappMessage
    return model.objects.create(
        campaign=campaign,
        organization_id=campaign.organization_id,
        customer=customer,
        status=status,
        sent_at=at,
    )


_numbers = iter(range(1, 10**9))


def _sale(store: Store, customer: Customer | None, at: datetime, total: str = "100.00") -> Sale:
    return Sale.objects.create(
        organization_id=store.organization_id,
        store=store,
        customer=customer,
        erp_id=f"V{next(_numbers)}",
        total=Decimal(total),
        sold_at=at,
    )


def _credited(sale: Sale) -> int | None:
    """The campaign the sale is attributed to, or None."""
    return SaleAttribution.objects.filter(sale=sale).values_list("campaign_id", flat=True).first()


def _rollup(campaign: Campaign) -> tuple[Decimal, int]:
    row = CampaignRevenue.objects.filter(campaign=campaign).first()
    return (row.revenue, row.conversions) if row else (Decimal("0"), 0)


def _rollups_match_rows() -> None:
    """Every campaign's rollup equals the sum of its attribution rows (the triggers' invariant)."""
    for campaign in Campaign.objects.all():
        rows = SaleAttribution.objects.filter(campaign=campaign)
        expected = (sum((r.total for r in rows), Decimal("0")), rows.count())
        assert _rollup(campaign) == expected, campaign.name


# -- the window and last touch ---------------------------------------------------------------------


def test_a_sale_counts_from_the_message_to_the_end_of_the_window_both_included(world):
    store, (ana, bruno, _carla) = world["store"], world["customers"]
    campaign = _campaign(world["org"], "Black Friday")
    _sent(campaign, ana, T0)
    before = _sale(store, ana, T0 - timedelta(microseconds=1))
    at_send = _sale(store, ana, T0)
    at_end = _sale(store, ana, T0 + WINDOW)
    after = _sale(store, ana, T0 + WINDOW + timedelta(microseconds=1))
    assert [_credited(s) for s in (before, at_send, at_end, after)] == [None, campaign.pk, campaign.pk, None]
    # Nobody else was reached: their sales in the window are not attributed.
    assert _credited(_sale(store, bruno, T0 + timedelta(hours=1))) is None
    assert _credited(_sale(store, None, T0 + timedelta(hours=1))) is None
    assert _rollup(campaign) == (Decimal("200.00"), 2)


def test_the_window_is_the_organizations(world):
    org, store, (ana, *_) = world["org"], world["store"], world["customers"]
    org.attribution_window_days = 2
    org.save()
    campaign = _campaign(org, "Natal")
    _sent(campaign, ana, T0)
    assert _credited(_sale(store, ana, T0 + timedelta(days=2))) == campaign.pk
    assert _credited(_sale(store, ana, T0 + timedelta(days=2, seconds=1))) is None


def test_the_window_is_validated_between_one_day_and_ninety(world):
    from django.core.exceptions import ValidationError
    from django.db import IntegrityError, transaction

    org = world["org"]
    for bad in (0, 91):
        org.attribution_window_days = bad
        with pytest.raises(ValidationError):
            org.full_clean()
        with pytest.raises(IntegrityError), transaction.atomic():
            org.save()
    org.attribution_window_days = 90
    org.full_clean()


def test_the_last_message_before_the_sale_wins_across_campaigns_and_channels(world):
    org, store, (ana, bruno, _carla) = world["org"], world["store"], world["customers"]
    whatsapp = _campaign(org, "Semana do cliente")
    email = _campaign(org, "Newsletter", Channel.EMAIL)
    later = _campaign(org, "Depois da venda")
    failed = _campaign(org, "Falhou")
    _sent(whatsapp, ana, T0)
    _sent(email, ana, T0 + timedelta(days=1))
    _sent(failed, ana, T0 + timedelta(days=1, hours=1), status=WhatsappMessage.Status.FAILED)
    _sent(later, ana, T0 + timedelta(days=3))  # after the sale: never counts for it
    sale = _sale(store, ana, T0 + timedelta(days=2), "250.00")
    assert _credited(sale) == email.pk
    assert SaleAttribution.objects.get(sale=sale).channel == Channel.EMAIL
    # Bruno: a WhatsApp message and an email at the same moment: the WhatsApp message wins.
    _sent(email, bruno, T0)
    _sent(whatsapp, bruno, T0)
    assert _credited(_sale(store, bruno, T0 + timedelta(hours=5), "10.00")) == whatsapp.pk
    assert _rollup(email) == (Decimal("250.00"), 1)
    assert _rollup(whatsapp) == (Decimal("10.00"), 1)
    assert _rollup(later) == _rollup(failed) == (Decimal("0"), 0)


def test_a_bounced_email_does_not_count_as_reached(world):
    org, store, (ana, *_) = world["org"], world["store"], world["customers"]
    email = _campaign(org, "Newsletter", Channel.EMAIL)
    _sent(email, ana, T0, status=EmailMessage.Status.BOUNCED)
    assert _credited(_sale(store, ana, T0 + timedelta(hours=1))) is None


def test_each_sale_counts_once_however_often_it_is_saved_or_evaluated(world):
    org, store, (ana, *_) = world["org"], world["store"], world["customers"]
    a, b = _campaign(org, "A"), _campaign(org, "B", Channel.EMAIL)
    _sent(a, ana, T0)
    _sent(b, ana, T0 + timedelta(hours=1))
    sale = _sale(store, ana, T0 + timedelta(hours=2), "80.00")
    for _ in range(3):
        sale.save()
        attribution.sales_attribute(organization_id=org.pk, sale_ids=[sale.pk])
    assert SaleAttribution.objects.filter(sale=sale).count() == 1
    assert _rollup(b) == (Decimal("80.00"), 1) and _rollup(a) == (Decimal("0"), 0)


def test_a_sale_arriving_late_is_attributed_by_when_it_was_sold(world):
    org, store, (ana, *_) = world["org"], world["store"], world["customers"]
    first, second = _campaign(org, "Primeira"), _campaign(org, "Segunda")
    _sent(first, ana, T0)
    _sent(second, ana, T0 + timedelta(days=5))
    # The ERP delivers a sale of day 2 after the second message went out.
    late = _sale(store, ana, T0 + timedelta(days=2), "40.00")
    assert _credited(late) == first.pk
    assert _rollup(first) == (Decimal("40.00"), 1) and _rollup(second) == (Decimal("0"), 0)


def test_a_message_sent_after_a_stored_sale_never_changes_it(world):
    org, store, (ana, *_) = world["org"], world["store"], world["customers"]
    first, second = _campaign(org, "Primeira"), _campaign(org, "Segunda")
    _sent(first, ana, T0)
    sale = _sale(store, ana, T0 + timedelta(hours=1))
    _sent(second, ana, T0 + timedelta(hours=2))
    attribution.organization_attribute(organization_id=org.pk)
    sale.save()
    assert _credited(sale) == first.pk
    assert _rollup(second) == (Decimal("0"), 0)


def test_a_changed_total_or_customer_moves_the_revenue(world):
    org, store, (ana, bruno, carla) = world["org"], world["store"], world["customers"]
    for_ana, for_bruno = _campaign(org, "Ana"), _campaign(org, "Bruno", Channel.EMAIL)
    _sent(for_ana, ana, T0)
    _sent(for_bruno, bruno, T0)
    sale = _sale(store, ana, T0 + timedelta(days=1), "100.00")
    _sale(store, ana, T0 + timedelta(days=1), "5.00")
    assert _rollup(for_ana) == (Decimal("105.00"), 2)

    sale.total = Decimal("130.50")
    sale.save()
    assert _rollup(for_ana) == (Decimal("135.50"), 2)

    sale.customer = bruno
    sale.save()
    assert _credited(sale) == for_bruno.pk
    assert _rollup(for_ana) == (Decimal("5.00"), 1)
    assert _rollup(for_bruno) == (Decimal("130.50"), 1)

    sale.customer = carla  # never reached
    sale.save()
    assert _credited(sale) is None
    assert _rollup(for_bruno) == (Decimal("0.00"), 0)

    sale.customer = ana
    sale.sold_at = T0 + WINDOW + timedelta(days=1)  # the ERP corrected the date: out of the window
    sale.save()
    assert _credited(sale) is None
    _rollups_match_rows()


def test_deleting_a_sale_or_a_campaign_keeps_the_rollup_right(world):
    org, store, (ana, bruno, _carla) = world["org"], world["store"], world["customers"]
    a, b = _campaign(org, "A"), _campaign(org, "B")
    _sent(a, ana, T0)
    _sent(b, bruno, T0)
    one = _sale(store, ana, T0 + timedelta(days=1), "70.00")
    _sale(store, ana, T0 + timedelta(days=2), "30.00")
    _sale(store, bruno, T0 + timedelta(days=1), "9.90")
    one.delete()
    assert _rollup(a) == (Decimal("30.00"), 1)
    b.delete()
    assert not SaleAttribution.objects.filter(campaign_id=b.pk).exists()
    assert not CampaignRevenue.objects.filter(campaign_id=b.pk).exists()
    _rollups_match_rows()


def test_concurrent_saves_and_refreshes_leave_every_attribution_and_the_rollup_exact(transactional_db):
    """Sales re-saved with other customers and totals while refreshes run in other threads: at the
    end a refresh finds nothing to change (no evaluation from an older copy of a sale survived),
    and each campaign's rollup is the sum of its rows."""
    import random
    import threading

    from django.db import connection

    org = Organization.objects.create(name="Concorrência", slug="concorrencia")
    store = Store.objects.create(organization=org, erp_code="001", name="Centro")
    people = [Customer.objects.create(organization=org, name=f"C{i}") for i in range(4)]
    campaigns = [_campaign(org, f"C{i}", Channel.EMAIL if i % 2 else Channel.WHATSAPP) for i in range(3)]
    for i, customer in enumerate(people[:3]):
        _sent(campaigns[i], customer, T0 + timedelta(hours=i))
    sales = [_sale(store, people[i % 4], T0 + timedelta(days=1, hours=i)) for i in range(24)]
    errors: list[BaseException] = []

    def saver(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(15):
                sale = Sale.objects.get(pk=rng.choice(sales).pk)
                sale.customer = rng.choice([*people, None])
                sale.total = Decimal(rng.randint(1, 99_999)) / 100
                sale.save()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    def refresher() -> None:
        try:
            for _ in range(6):
                attribution.organization_attribute(organization_id=org.pk, page_ids=5)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=saver, args=(n,)) for n in range(2)]
    threads += [threading.Thread(target=refresher) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    counts = attribution.organization_attribute(organization_id=org.pk)
    assert (counts.sales, counts.created, counts.changed, counts.removed) == (24, 0, 0, 0)
    assert counts.attributed == SaleAttribution.objects.filter(organization=org).count()
    _rollups_match_rows()


# -- the admin, the command, campaign_status -------------------------------------------------------


def test_a_sale_saved_in_the_admin_is_attributed(world, admin_client):
    org, store, (ana, *_) = world["org"], world["store"], world["customers"]
    campaign = _campaign(org, "Black Friday")
    _sent(campaign, ana, T0)
    sale = _sale(store, ana, T0 - timedelta(days=1), "99.90")  # before the message
    assert _credited(sale) is None
    local = (T0 + timedelta(days=1)).astimezone(org_zone(org))
    response = admin_client.post(
        f"/admin/crm/sale/{sale.pk}/change/",
        {
            "organization": org.pk,
            "store": store.pk,
            "customer": ana.pk,
            "erp_id": sale.erp_id,
            "total": "99.90",
            "sold_at_0": local.strftime("%d/%m/%Y"),
            "sold_at_1": local.strftime("%H:%M:%S"),
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    sale.refresh_from_db()
    assert sale.sold_at == T0 + timedelta(days=1)
    assert _credited(sale) == campaign.pk
    assert _rollup(campaign) == (Decimal("99.90"), 1)


def org_zone(org: Organization):
    from zoneinfo import ZoneInfo

    return ZoneInfo(org.timezone)


def _attribute(*args: str) -> str:
    out = io.StringIO()
    call_command("attribute", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_attribute_command_refreshes_an_organization_and_a_second_run_writes_nothing(world, english):
    org, store, (ana, bruno, _carla) = world["org"], world["store"], world["customers"]
    campaign = _campaign(org, "Black Friday")
    sales = [_sale(store, ana, T0 + timedelta(days=d), "10.00") for d in (1, 3, 5)]
    # Messages recorded after their sales were stored (a status settled late): only a refresh sees them.
    _sent(campaign, ana, T0)
    assert not SaleAttribution.objects.exists()

    first = _attribute("--organization", org.slug)
    assert "3 sales evaluated, 3 attributed (3 new, 0 changed, 0 removed)" in first, first
    assert _rollup(campaign) == (Decimal("30.00"), 3)
    second = _attribute("--organization", org.slug)
    assert "3 sales evaluated, 3 attributed (0 new, 0 changed, 0 removed)" in second, second
    assert _rollup(campaign) == (Decimal("30.00"), 3)

    org.attribution_window_days = 2  # the day-3 and day-5 sales fall out
    org.save()
    third = _attribute("--organization", org.slug, "--since", "2026-11-04")
    assert "2 sales evaluated, 0 attributed (0 new, 0 changed, 2 removed)" in third, third
    assert [_credited(s) for s in sales] == [campaign.pk, None, None]
    assert _rollup(campaign) == (Decimal("10.00"), 1)
    _sale(store, bruno, T0)  # another customer's sale: evaluated, not attributed
    assert "4 sales evaluated, 1 attributed (0 new, 0 changed, 0 removed)" in _attribute(
        "--organization", org.slug
    )


def test_the_attribute_command_names_an_unknown_organization(world):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="nope"):
        _attribute("--organization", "nope")


def test_campaign_status_json_has_the_revenue_as_a_decimal_string_and_the_conversions(world):
    org, store, (ana, _bruno, _carla) = world["org"], world["store"], world["customers"]
    campaign = _campaign(org, "Black Friday")
    _sent(campaign, ana, T0)
    _sale(store, ana, T0 + timedelta(days=1), "1000.00")
    _sale(store, ana, T0 + timedelta(days=2), "234.50")
    out = io.StringIO()
    call_command("campaign_status", str(campaign.pk), "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["revenue"] == "1234.50" and data["conversions"] == 2
    other = _campaign(org, "Nada")
    out = io.StringIO()
    call_command("campaign_status", str(other.pk), "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["revenue"] == "0.00" and data["conversions"] == 0


def test_the_campaign_page_shows_revenue_conversions_rate_and_revenue_per_cost(world, admin_client):
    org, store, (ana, bruno, carla) = world["org"], world["store"], world["customers"]
    campaign = _campaign(org, "Black Friday")
    for customer in (ana, bruno, carla):
        _sent(campaign, customer, T0)
    # A cost in reais, as the revenue: a plain ratio (a cost in dollars: see the next test).
    CampaignMetric.objects.create(
        campaign=campaign, queued=3, sent=3, cost=Decimal("0.187500"), cost_currency="BRL"
    )
    _sale(store, ana, T0 + timedelta(days=1), "1000.00")
    _sale(store, ana, T0 + timedelta(days=2), "234.50")
    _sale(store, bruno, T0 + timedelta(days=1), "0.13")
    page = admin_client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    figures = page[page.index('id="campaign-attribution"') :]
    figures = figures[: figures.index("</table>")]
    assert 'data-field="revenue">R$\xa01.234,63<' in figures
    assert 'data-field="conversions">3<' in figures
    assert 'data-field="buyers">2<' in figures  # Ana bought twice: one buyer
    assert 'data-field="conversion_rate">66,7%<' in figures  # 2 buyers ÷ 3 customers reached
    assert 'data-field="revenue_per_cost">6.584,69<' in figures  # 1234.63 / 0.1875
    # A campaign without cost or anyone reached shows dashes, never a division by zero.
    empty = _campaign(org, "Rascunho")
    page = admin_client.get(f"/admin/campaigns/campaign/{empty.pk}/change/").content.decode()
    assert 'data-field="revenue">R$\xa00,00<' in page and 'data-field="revenue_per_cost">—<' in page


def test_the_organization_dashboard_shows_revenue_per_campaign_and_per_store(world, admin_client):
    from django.utils import timezone

    org, store, (ana, bruno, _carla) = world["org"], world["store"], world["customers"]
    other_store = Store.objects.create(organization=org, erp_code="002", name="Shopping")
    now = timezone.now()
    campaign = Campaign.objects.create(
        organization=org, name="Black Friday", status=Campaign.Status.SENT, started_at=now - timedelta(days=3)
    )
    _sent(campaign, ana, now - timedelta(days=3))
    _sent(campaign, bruno, now - timedelta(days=3))
    _sale(store, ana, now - timedelta(days=2), "1500.00")
    _sale(other_store, bruno, now - timedelta(days=1), "3.13")
    _sale(other_store, bruno, now - timedelta(days=1, hours=1), "10.00")
    page = admin_client.get(f"/admin/crm/organization/{org.pk}/dashboard/").content.decode()
    row = page[page.index(f'<tr data-campaign="{campaign.pk}"') :]
    row = row[: row.index("</tr>")]
    assert 'data-field="revenue">R$\xa01.513,13<' in row and 'data-field="conversions">3<' in row
    stores = page[page.index('id="dashboard-revenue-stores"') :]
    stores = stores[: stores.index("</table>")]
    assert "Centro" in stores and "R$\xa01.500,00" in stores
    assert "Shopping" in stores and "R$\xa013,13" in stores


# -- the SQL against a reference -------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    campaign: int
    channel: str
    id: int
    customer: int
    sent_at: datetime
    reached: bool


def reference(
    messages: list[Message], sales: list[tuple[int, int | None, datetime]], window: timedelta
) -> dict[int, tuple[int, str, int]]:
    """For each sale (id, customer, sold_at): the (campaign, channel, message id) it is credited to."""
    credited = {}
    for sale_id, customer, sold_at in sales:
        touches = [
            m
            for m in messages
            if m.reached and m.customer == customer and m.sent_at <= sold_at <= m.sent_at + window
        ]
        if touches:
            best = max(touches, key=lambda m: (m.sent_at, m.channel == Channel.WHATSAPP, m.id))
            credited[sale_id] = (best.campaign, best.channel, best.id)
    return credited


# Times on a coarse grid (hours, a few exact window ends) so ties and boundaries come up often.
HOURS = st.integers(min_value=0, max_value=24 * 12)


@hsettings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    window_days=st.integers(min_value=1, max_value=4),
    messages=st.lists(
        st.tuples(
            st.integers(0, 3),  # campaign index
            st.integers(0, 2),  # customer index
            HOURS,
            st.booleans(),  # reached (else failed / bounced)
        ),
        max_size=12,
    ),
    sales=st.lists(st.tuples(st.integers(0, 3), HOURS, st.integers(1, 50_000)), max_size=12),
)
def test_the_sql_attribution_equals_the_reference(world, window_days, messages, sales):
    org, store, customers = world["org"], world["store"], world["customers"]
    Sale.objects.filter(organization=org).delete()
    Campaign.objects.filter(organization=org).delete()
    org.attribution_window_days = window_days
    org.save()
    campaigns = [_campaign(org, f"C{i}", Channel.EMAIL if i % 2 else Channel.WHATSAPP) for i in range(4)]
    stored = []
    for campaign_index, customer_index, hours, reached in messages:
        campaign, customer = campaigns[campaign_index], customers[customer_index]
        if (
            (EmailMessage if campaign.channel == Channel.EMAIL else WhatsappMessage)
            .objects.filter(campaign=campaign, customer=customer)
            .exists()
        ):
            continue  # one message per campaign and customer
        failed = "bounced" if campaign.channel == Channel.EMAIL else "failed"
        message = _sent(campaign, customer, T0 + timedelta(hours=hours), "sent" if reached else failed)
        stored.append(
            Message(campaign.pk, campaign.channel, message.pk, customer.pk, message.sent_at, reached)
        )
    written = []
    for customer_index, hours, cents in sales:
        customer = customers[customer_index] if customer_index < len(customers) else None
        written.append(_sale(store, customer, T0 + timedelta(hours=hours), str(Decimal(cents) / 100)))
    expected = reference(
        stored, [(s.pk, s.customer_id, s.sold_at) for s in written], timedelta(days=window_days)
    )

    def attributed() -> dict[int, tuple[int, str, int]]:
        return {
            a.sale_id: (a.campaign_id, a.channel, a.message_id)
            for a in SaleAttribution.objects.filter(organization=org)
        }

    assert attributed() == expected  # each sale evaluated as it was saved
    for campaign in campaigns:
        totals = [s.total for s in written if expected.get(s.pk, (None,))[0] == campaign.pk]
        assert _rollup(campaign) == (sum(totals, Decimal("0")), len(totals))
    # The command's refresh, in pages of three ids, lands on the same rows and changes none.
    counts = attribution.organization_attribute(organization_id=org.pk, page_ids=3)
    assert (counts.sales, counts.attributed, counts.created, counts.changed, counts.removed) == (
        len(written),
        len(expected),
        0,
        0,
        0,
    )
    assert attributed() == expected


def test_revenue_per_cost_never_divides_reais_by_dollars_but_by_the_labelled_estimate(world, admin_client):
    org, store, ana = world["org"], world["store"], world["customers"][0]
    campaign = _campaign(org, "Black Friday")
    _sent(campaign, ana, T0)
    CampaignMetric.objects.create(
        campaign=campaign, queued=1, sent=1, cost=Decimal("0.0625"), cost_currency="USD"
    )
    _sale(store, ana, T0 + timedelta(days=1), "100.00")

    def per_cost() -> str:
        page = admin_client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
        cell = page[page.index('data-field="revenue_per_cost">') :]
        return cell[len('data-field="revenue_per_cost">') : cell.index("<")]

    assert per_cost() == "—"  # R$ 100 ÷ US$ 0.0625 is no ratio
    org.cost_conversion_rate, org.cost_conversion_currency = Decimal("5.00"), "USD"
    org.save()
    assert per_cost() == "320,00 (estimativa)"  # 100 ÷ (0.0625 * 5)
