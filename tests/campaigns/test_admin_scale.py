"""The admin's message lists and pages stay bounded on big tables (the scale itself is measured by
benchmarks/admin_pages.py): queries that do not grow with the rows, no COUNT of a whole table,
filters and searches on indexes, no <select> of every customer or campaign."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from campaigns.admin.big_tables import CampaignFilter, CappedCountPaginator
from campaigns.models import Campaign, CampaignMetric, Channel, EmailMessage, WhatsappMessage
from crm.models import Customer

WA = "/admin/campaigns/whatsappmessage/"
EM = "/admin/campaigns/emailmessage/"

Seed = Callable[..., list]


@pytest.fixture
def seed(world) -> Seed:
    """seed(n, channel=…, campaign=…): n more messages of a campaign, each to a new customer, in bulk."""
    org = world["org"]
    made = {"customers": 0}

    def _seed(n: int, *, channel: str = Channel.WHATSAPP, campaign: Campaign | None = None) -> list:
        if campaign is None:
            campaign = Campaign.objects.create(organization=org, name=f"Campanha {channel}", channel=channel)
            CampaignMetric.objects.create(campaign=campaign, queued=n)
        start = made["customers"]
        made["customers"] += n
        customers = Customer.objects.bulk_create(
            [
                Customer(
                    organization=org,
                    erp_id=f"S{i}",
                    name=f"Cliente {i}",
                    email=f"Cliente{i}@Example.com.br",
                    phone=f"+55119{80000000 + i:08d}",
                )
                for i in range(start, start + n)
            ]
        )
        statuses = ["read", "delivered", "sent", "failed"]
        if channel == Channel.EMAIL:
            return EmailMessage.objects.bulk_create(
                [
                    EmailMessage(
                        campaign=campaign,
                        organization=org,
                        customer=c,
                        email=c.email,
                        status=["sent", "bounced"][k % 2],
                        esp_message_id=f"esp-{c.pk}",
                    )
                    for k, c in enumerate(customers)
                ]
            )
        return WhatsappMessage.objects.bulk_create(
            [
                WhatsappMessage(
                    campaign=campaign,
                    organization=org,
                    customer=c,
                    phone=c.phone,
                    status=statuses[k % 4],
                    wamid=f"wamid.HBgN{c.pk:012d}",
                    error_code=131050 if k % 4 == 3 else None,
                )
                for k, c in enumerate(customers)
            ]
        )

    return _seed


def _queries(client, url: str) -> tuple[int, str, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(captured), response.content.decode(), [q["sql"] for q in captured.captured_queries]


def _rows(page: str) -> int:
    return len(re.findall(r'<tr><th class="field-id">', page))


@pytest.mark.parametrize(
    ("channel", "url"),
    [
        (Channel.WHATSAPP, WA),
        (Channel.WHATSAPP, WA + "?status__exact=failed"),
        (Channel.WHATSAPP, WA + "?campaign__id__exact={campaign}"),
        (Channel.WHATSAPP, WA + "?error_code__exact=131050"),
        (Channel.WHATSAPP, WA + "?q=%2B5511980"),
        (Channel.WHATSAPP, WA + "?p=2"),
        (Channel.EMAIL, EM),
        (Channel.EMAIL, EM + "?campaign__id__exact={campaign}&status__exact=sent"),
        (Channel.EMAIL, EM + "?q=CLIENTE1%40example.com.br"),
        (Channel.WHATSAPP, "/admin/campaigns/campaignmetric/"),
    ],
)
def test_a_message_list_takes_the_same_queries_for_10_and_200_messages(
    admin_client, seed, django_assert_max_num_queries, channel, url
):
    first = seed(10, channel=channel)
    campaign = first[0].campaign
    url = url.format(campaign=campaign.pk)
    if "p=2" in url:  # page 2 exists only with the 200
        few = None
    else:
        few, page, _ = _queries(admin_client, url)
        assert _rows(page) or "campaignmetric" in url
    seed(190, channel=channel, campaign=campaign)

    with django_assert_max_num_queries(8):
        many, page, sql = _queries(admin_client, url)

    assert few is None or many == few
    assert "campaignmetric" in url or 0 < _rows(page) <= 100
    assert not any(" OFFSET " not in q and "LIMIT" not in q and "COUNT(" in q for q in sql)  # counts capped


def test_an_unfiltered_big_table_shows_postgresql_s_estimate_and_is_never_counted(
    admin_client, seed, monkeypatch, english
):
    seed(200)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE campaigns_whatsappmessage")
    monkeypatch.setattr(CappedCountPaginator, "cap", 50)

    _, page, sql = _queries(admin_client, WA)

    assert "about 200 WhatsApp messages" in page
    assert not any("COUNT(" in q for q in sql)  # the whole table is never counted
    assert _rows(page) == 100 and 'href="?p=2"' in page
    assert (
        "results" not in page.split('id="changelist-search"')[1].split("</form>")[0]
    )  # no guessed "N results"


def test_a_filtered_list_counts_at_most_cap_plus_one_rows_and_says_so(
    admin_client, seed, monkeypatch, english
):
    seed(200)
    monkeypatch.setattr(CappedCountPaginator, "cap", 50)

    response = admin_client.get(WA + "?status__exact=read")  # 50 of the 200

    cl = response.context["cl"]
    assert cl.result_count == 50 and not cl.paginator.capped
    assert '<span id="result-count">50 WhatsApp messages</span>' in response.content.decode()

    _, page, sql = _queries(admin_client, WA + "?q=%2B55119")  # all 200 match the phone prefix
    assert "more than 50 WhatsApp messages" in page and "Only the first 50 rows are counted" in page
    count = next(q for q in sql if "COUNT(" in q)
    assert "LIMIT 51" in count


def test_the_campaign_filter_takes_any_campaign_id_and_lists_only_the_newest(
    admin_client, seed, world, english
):
    old = seed(3)[0].campaign
    other = seed(2)[0].campaign
    Campaign.objects.bulk_create(
        [Campaign(organization=world["org"], name=f"Nova {i}") for i in range(CampaignFilter.newest)]
    )
    email = seed(1, channel=Channel.EMAIL)[0].campaign

    listing = admin_client.get(WA).content.decode()
    assert "Nova 19" in listing and f"(#{old.pk})" not in listing  # 20 newest, not every campaign
    assert f"(#{email.pk})" not in listing  # only this channel's

    response = admin_client.get(f"{WA}?campaign__id__exact={old.pk}")
    assert {m.campaign_id for m in response.context["cl"].result_list} == {old.pk}
    assert response.context["cl"].result_count == 3
    assert f"(#{old.pk})" in response.content.decode()  # the chosen one is offered, selected
    assert {m.campaign_id for m in admin_client.get(WA).context["cl"].result_list} == {old.pk, other.pk}

    assert admin_client.get(f"{WA}?campaign__id__exact=x").url == f"{WA}?e=1"


def test_search_finds_a_phone_by_its_beginning_a_wamid_and_an_address_in_any_case(admin_client, seed):
    messages = seed(20)
    target = messages[7]
    emails = seed(5, channel=Channel.EMAIL)

    def found(url: str) -> set[int]:
        _, _, sql = _queries(admin_client, url)
        assert not any("UPPER(" in q and "phone" in q for q in sql)  # the phone index, never UPPER()
        return {m.pk for m in admin_client.get(url).context["cl"].result_list}

    assert found(f"{WA}?q=%2B55+11+98000-0007") == {target.pk}  # punctuation and spaces ignored
    assert found(f"{WA}?q=551198000000") == {m.pk for m in messages[:10]}  # +551198000000…
    assert found(f"{WA}?q={target.wamid}") == {target.pk}
    assert found(f"{WA}?q=%2B5599") == set()
    email = emails[2]
    assert {m.pk for m in admin_client.get(f"{EM}?q={email.email.upper()}").context["cl"].result_list} == {
        email.pk
    }
    assert {m.pk for m in admin_client.get(f"{EM}?q=esp-{email.customer_id}").context["cl"].result_list} == {
        email.pk
    }


def test_the_error_code_filter_offers_known_codes_without_reading_the_messages(admin_client, seed, english):
    seed(8)

    _, page, sql = _queries(admin_client, WA)
    assert "131050 · customer opted out" in page
    assert not any("DISTINCT" in q for q in sql)
    failed = admin_client.get(f"{WA}?error_code__exact=131050").context["cl"].result_list
    assert len(failed) == 2 and {m.error_code for m in failed} == {131050}


@pytest.mark.parametrize("model", [WhatsappMessage, EmailMessage])
def test_a_message_page_shows_its_customer_and_campaign_without_a_select_of_them(
    admin_client, seed, django_assert_max_num_queries, model
):
    message = seed(30, channel=Channel.EMAIL if model is EmailMessage else Channel.WHATSAPP)[4]
    url = f"/admin/campaigns/{model._meta.model_name}/{message.pk}/change/"

    with django_assert_max_num_queries(8):
        page = admin_client.get(url).content.decode()

    assert "<select" not in page
    assert message.customer.name in page and message.campaign.name in page


@pytest.mark.parametrize("model", [WhatsappMessage, EmailMessage])
def test_a_message_page_shows_every_field_whose_it_is_first(admin_client, seed, model):
    message = seed(1, channel=Channel.EMAIL if model is EmailMessage else Channel.WHATSAPP)[0]

    page = admin_client.get(f"/admin/campaigns/{model._meta.model_name}/{message.pk}/change/")

    shown = re.findall(r'class="form-row field-(\w+)', page.content.decode())
    assert shown[:5] == ["id", "campaign", "organization", "customer", "status"]
    # The error reason as the list shows it: in the page's language (caps.skip_reason_label).
    assert sorted(shown) == sorted(
        "reason" if f.name == "error_reason" else f.name for f in model._meta.fields
    )


def test_a_message_list_has_no_bulk_actions_nor_facet_counts(admin_client, seed):
    seed(5)

    page = admin_client.get(WA + "?_facets=True").content.decode()

    assert 'name="action"' not in page and 'name="_selected_action"' not in page
    assert "(5)" not in page  # no counts next to the filter choices
    add = admin_client.get("/admin/campaigns/campaignmetric/add/").content.decode()
    assert '<select name="campaign"' not in add
