"""The campaign charts' JSON, the organization's 30-day dashboard and the vendored chart library."""

from __future__ import annotations

import itertools
import json
import re
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.test import Client
from django.utils import dateformat, timezone

from campaigns import dashboards, lifecycle, links, statuses
from campaigns.models import Campaign, CampaignMetric, Channel, EmailMessage, WhatsappMessage
from crm.models import Customer, Membership, Organization
from integrations.whatsapp.webhooks import StatusEvent
from project import dashboards as org_dashboards
from surveys.models import Survey
from tests.surveys.conftest import Shop

SAO_PAULO = ZoneInfo("America/Sao_Paulo")
UPLOT = "crm/vendor/uplot/uPlot.iife.min.js"


def _series_url(campaign: Campaign) -> str:
    return f"/admin/campaigns/campaign/{campaign.pk}/series/"


def _dashboard_url(org: Organization) -> str:
    return f"/admin/crm/organization/{org.pk}/dashboard/"


def _customers(org: Organization, n: int) -> list[Customer]:
    return Customer.objects.bulk_create(
        [
            Customer(
                marketing_consent=True,
                organization=org,
                erp_id=f"D{i}",
                name=f"Cliente {i}",
                phone=f"+55119{70000000 + i:08d}",
            )
            for i in range(n)
        ]
    )


def _campaign(org: Organization, started_at: datetime, **fields) -> Campaign:
    fields = {"name": "Dia das Mães", "status": Campaign.Status.SENT, "finished_at": started_at, **fields}
    return Campaign.objects.create(organization=org, started_at=started_at, **fields)


# -- the campaign's series ---------------------------------------------------------------------------


def test_a_real_campaigns_buckets_add_up_to_its_metrics(wa, sandbox, run_jobs, admin_client, english):
    people = wa["customers"](12)
    sandbox.add_rule(to=people[3].phone.lstrip("+"), code=131026)
    campaign = lifecycle.campaign_start(campaign=wa["campaign"]())
    run_jobs()
    sent = list(WhatsappMessage.objects.filter(campaign=campaign, status="sent").order_by("pk"))
    assert len(sent) == 11
    # Stamped now, after every send: a stamp ahead of the clock is left off the chart until its
    # minute comes (one run in sixty, now + 1 s fell in the next minute).
    later = timezone.now()
    events = [StatusEvent(wamid=m.wamid or "", status="delivered", timestamp=later) for m in sent[:8]]
    events += [StatusEvent(wamid=m.wamid or "", status="read", timestamp=later) for m in sent[:3]]
    statuses.statuses_apply(events=events)
    for message in sent[:2]:
        links.message_click(message=message)

    response = admin_client.get(_series_url(campaign))

    assert response.status_code == 200
    data = response.json()
    metric = CampaignMetric.objects.get(campaign=campaign)
    assert (metric.sent, metric.delivered, metric.read, metric.clicked, metric.failed) == (11, 8, 3, 2, 1)
    sums = {key: sum(values) for key, values in data["series"].items()}
    assert sums == data["totals"] == {"sent": 11, "delivered": 8, "read": 3, "clicked": 2, "failed": 1}
    assert data["bucket_seconds"] == 60  # a campaign of a few seconds: minute buckets
    assert all(len(values) == len(data["timestamps"]) for values in data["series"].values())
    assert not data["live"]  # finished: its minute and the quiet after it, not a lone point
    assert len(data["timestamps"]) >= dashboards.MIN_POINTS
    assert Decimal(data["cost_total"]) == metric.cost == Decimal("0.0625") * 11
    assert data["cost"][-1] == pytest.approx(float(metric.cost))
    assert data["cost"] == sorted(data["cost"])  # cumulative
    assert data["live"] is False and data["labels"]["read"] == "read"


def test_buckets_are_minutes_of_the_organizations_day_and_hold_what_happened_in_them(world):
    org = world["org"]
    start = datetime(2025, 3, 10, 10, 0, tzinfo=SAO_PAULO)  # 13:00 UTC
    campaign = _campaign(org, start, finished_at=start + timedelta(minutes=3))
    people = _customers(org, 6)
    sent_at = [start + timedelta(seconds=s) for s in (5, 30, 59, 61, 150, 170)]
    WhatsappMessage.objects.bulk_create(
        [
            WhatsappMessage(
                campaign=campaign,
                organization=org,
                customer=c,
                status="read" if i < 2 else "sent",
                sent_at=at,
                read_at=start + timedelta(hours=1, seconds=i) if i < 2 else None,
                cost=Decimal("0.0625"),
            )
            for i, (c, at) in enumerate(zip(people, sent_at, strict=True))
        ]
    )

    data = dashboards.campaign_series(campaign=campaign)

    # The chart runs from the start to the last read, an hour later: 61 minute buckets.
    assert data["bucket_seconds"] == 60
    assert data["timestamps"][0] == int(start.timestamp())
    assert len(data["timestamps"]) == 61
    assert data["series"]["sent"][:4] == [3, 1, 2, 0]
    assert data["series"]["read"][60] == 2 and sum(data["series"]["read"]) == 2
    assert data["cost"][:4] == [0.1875, 0.25, 0.375, 0.375]
    assert data["time_zone"] == "America/Sao_Paulo"


def test_a_campaign_across_a_daylight_saving_change_keeps_every_message_in_its_bucket(world):
    """Buckets are counted by the database in absolute time; the chart's times must be too, or every
    bucket after the clock change is an hour off and reads 0."""
    org = world["org"]
    org.timezone = "America/New_York"  # clocks go forward on 2025-03-09 at 02:00
    org.save(update_fields=["timezone"])
    zone = ZoneInfo(org.timezone)
    start = datetime(2025, 3, 8, 12, 0, tzinfo=zone)
    sent_at = [start + timedelta(hours=h) for h in (0, 5, 13, 20, 26, 33, 40, 47)]
    campaign = _campaign(org, start, finished_at=sent_at[-1])
    people = _customers(org, len(sent_at))
    WhatsappMessage.objects.bulk_create(
        [
            WhatsappMessage(campaign=campaign, organization=org, customer=c, status="sent", sent_at=at)
            for c, at in zip(people, sent_at, strict=True)
        ]
    )

    data = dashboards.campaign_series(campaign=campaign)

    step, stamps, sent = data["bucket_seconds"], data["timestamps"], data["series"]["sent"]
    assert sum(sent) == len(sent_at)
    for at in sent_at:  # each message counted in the bucket that holds its moment
        i = max(i for i, t in enumerate(stamps) if t <= at.timestamp())
        assert at.timestamp() < stamps[i] + step and sent[i] >= 1, (at, i)
    assert all(b - a == step for a, b in itertools.pairwise(stamps))


def test_a_long_campaign_gets_wider_buckets_and_never_more_than_300_points(world):
    org = world["org"]
    start = datetime(2025, 3, 10, 9, 17, tzinfo=SAO_PAULO)
    campaign = _campaign(org, start, finished_at=start + timedelta(days=3))
    people = _customers(org, 4)
    WhatsappMessage.objects.bulk_create(
        [
            WhatsappMessage(campaign=campaign, organization=org, customer=c, status="sent", sent_at=at)
            for c, at in zip(
                people,
                [start, start + timedelta(hours=7), start + timedelta(days=2), start + timedelta(days=3)],
                strict=True,
            )
        ]
    )

    data = dashboards.campaign_series(campaign=campaign)

    assert data["bucket_seconds"] == 900  # 3 days in 15-minute buckets: 289 points
    assert len(data["timestamps"]) <= dashboards.MAX_POINTS
    first = datetime.fromtimestamp(data["timestamps"][0], tz=SAO_PAULO)
    assert (first.hour, first.minute) == (9, 15)  # aligned on the organization's quarter hours
    assert sum(data["series"]["sent"]) == 4
    assert data["series"]["sent"][-1] == 1


def test_an_email_campaign_splits_bounces_and_blocks_from_failures_and_counts_opens(world):
    org = world["org"]
    start = timezone.now() - timedelta(minutes=10)
    campaign = _campaign(org, start, channel=Channel.EMAIL, status=Campaign.Status.SENDING, finished_at=None)
    people = _customers(org, 6)
    rows = [
        ("sent", {"sent_at": start, "opened_at": start + timedelta(minutes=2)}),
        ("sent", {"sent_at": start, "opened_at": start + timedelta(minutes=2), "clicked_at": start}),
        ("bounced", {"failed_at": start + timedelta(minutes=1)}),
        ("blocked", {"failed_at": start + timedelta(minutes=1)}),
        ("failed", {"failed_at": start + timedelta(minutes=1)}),
        ("queued", {}),
    ]
    EmailMessage.objects.bulk_create(
        [
            EmailMessage(campaign=campaign, organization=org, customer=c, status=status, **times)
            for c, (status, times) in zip(people, rows, strict=True)
        ]
    )

    data = dashboards.campaign_series(campaign=campaign)

    assert data["totals"] == {"sent": 2, "opened": 2, "clicked": 1, "bounced": 1, "blocked": 1, "failed": 1}
    assert data["series"]["bounced"][1] == 1 and data["series"]["failed"][1] == 1
    assert data["series"]["blocked"][1] == 1
    assert data["live"] is True  # still sending: the page keeps refreshing the chart
    assert Decimal(data["cost_total"]) == 0


def test_a_campaign_not_started_has_empty_series(world):
    campaign = Campaign.objects.create(organization=world["org"], name="Rascunho")
    data = dashboards.campaign_series(campaign=campaign)
    assert data["timestamps"] == [] and data["totals"]["sent"] == 0


def test_the_series_answer_in_few_queries_whatever_the_size(
    world, admin_client, django_assert_max_num_queries
):
    org = world["org"]
    start = timezone.now() - timedelta(hours=2)
    campaign = _campaign(org, start, finished_at=start + timedelta(hours=1))
    people = _customers(org, 400)
    WhatsappMessage.objects.bulk_create(
        [
            WhatsappMessage(
                campaign=campaign,
                organization=org,
                customer=c,
                status="delivered",
                sent_at=start + timedelta(seconds=9 * i),
                delivered_at=start + timedelta(seconds=9 * i + 2),
                cost=Decimal("0.0625"),
            )
            for i, c in enumerate(people)
        ]
    )
    # session, user, campaign, the cost's currency, time span, one GROUP BY per timestamp column (5)
    with django_assert_max_num_queries(10):
        response = admin_client.get(_series_url(campaign))
    data = response.json()
    assert data["totals"]["sent"] == data["totals"]["delivered"] == 400
    assert Decimal(data["cost_total"]) == Decimal("25.000000")


def test_the_series_and_the_dashboard_are_for_staff_with_permission_only(world, client):
    org = world["org"]
    campaign = _campaign(org, timezone.now() - timedelta(minutes=5), name="Segredo de Natal")
    anonymous = client.get(_series_url(campaign))
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    assert b"Segredo" not in anonymous.content

    User.objects.create_user("cliente", password="pw-cliente-123")
    client.force_login(User.objects.get(username="cliente"))
    for url in (_series_url(campaign), _dashboard_url(org)):
        refused = client.get(url)
        assert refused.status_code == 302 and "/admin/login/" in refused["Location"]
        assert b"Segredo" not in refused.content

    staff = User.objects.create_user("operador", password="pw-operador-123", is_staff=True)
    client.force_login(User.objects.get(username="operador"))
    hidden = client.get(_series_url(campaign))
    assert hidden.status_code == 404 and hidden.json() == {"error": "not found"}
    assert client.get(_dashboard_url(org)).status_code == 404  # staff of no organization sees none
    staff.user_permissions.add(  # Django's model permissions give a non-member nothing
        Permission.objects.get(codename="view_campaign"), Permission.objects.get(codename="view_organization")
    )
    assert client.get(_dashboard_url(org)).status_code == 404
    Membership.objects.create(user=staff, organization=org, role=Membership.Role.VIEWER)
    assert client.get(_series_url(campaign)).json()["id"] == campaign.pk
    assert client.get(_dashboard_url(org)).status_code == 200
    assert client.get(f"/admin/campaigns/campaign/{campaign.pk + 1000}/series/").status_code == 404


def test_the_change_page_draws_the_charts_below_the_live_status(world, admin_client, english):
    campaign = _campaign(world["org"], timezone.now() - timedelta(minutes=5))
    html = admin_client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert '<div id="campaign-chart-events"' in html and '<div id="campaign-chart-cost"' in html
    assert html.index('id="live-status"') < html.index('id="campaign-chart-events"')
    assert "/static/crm/vendor/uplot/uPlot.iife.min.js" in html
    assert 'data-url="../series/"' in html and "setTimeout(tick, 10000)" in html
    assert 'data-field="eta_seconds"' in html  # the live status is still there

    add = admin_client.get("/admin/campaigns/campaign/add/")
    assert add.status_code == 200 and b"uPlot.iife.min.js" not in add.content
    draft = Campaign.objects.create(organization=world["org"], name="Rascunho")
    assert (
        'id="campaign-chart-events"'
        not in admin_client.get(f"/admin/campaigns/campaign/{draft.pk}/change/").content.decode()
    )


# -- the organization's dashboard --------------------------------------------------------------------


def _answer(shop: Shop, store, score: int, answered_at: datetime) -> None:
    survey = Survey.objects.get(sale=shop.sale(shop.ana, store=store))
    Survey.objects.filter(pk=survey.pk).update(
        status=Survey.Status.ANSWERED, score=score, answered_at=answered_at, sent_at=answered_at
    )


@pytest.fixture
def shop(db) -> Shop:
    """The surveys' world (surveys by email): two stores, Centro and Shopping."""
    return Shop()


@pytest.fixture
def board(shop: Shop) -> dict:
    """Two campaigns in the window, one started 31 days ago; NPS answers in and out of the window."""
    org = shop.org
    now = timezone.now()
    recent = _campaign(org, now - timedelta(days=2), name="Liquidação de Inverno")
    CampaignMetric.objects.create(
        campaign=recent, queued=1500, sent=1234, delivered=1200, read=800, clicked=90, failed=7, cost="77.125"
    )
    email = _campaign(org, now - timedelta(hours=1), name="Newsletter", channel=Channel.EMAIL)
    CampaignMetric.objects.create(campaign=email, queued=50, sent=48, bounced=2)
    old = _campaign(org, now - timedelta(days=31), name="Campanha Antiga")
    CampaignMetric.objects.create(campaign=old, queued=10, sent=10)
    # Centro: 10, 9, 10 (promoters), 7 (passive), 3 (detractor): NPS 40. Shopping: 6 (detractor).
    for score in (10, 9, 10, 7, 3):
        _answer(shop, shop.centro, score, now - timedelta(days=3))
    _answer(shop, shop.shopping, 6, now - timedelta(days=1))
    _answer(shop, shop.centro, 0, now - timedelta(days=40))  # outside the window
    return {"recent": recent, "email": email, "old": old}


def test_nps_of_a_window_adds_up_the_answers_per_store(shop: Shop, board: dict):
    since = timezone.now() - timedelta(days=30)
    total, stores = org_dashboards.nps_window(organization=shop.org, since=since, until=timezone.now())
    centro = next(s for s in stores if s.store_name == "Centro")
    assert (centro.responses, centro.promoters, centro.passives, centro.detractors) == (5, 3, 1, 1)
    assert centro.nps == 40.0
    assert (total.responses, total.promoters, total.detractors, total.nps) == (6, 3, 2, 16.7)


def test_the_dashboard_shows_the_last_30_days(
    shop: Shop, board: dict, admin_client, english, django_assert_max_num_queries
):
    org = shop.org
    Organization.objects.filter(pk=org.pk).update(
        whatsapp_paused_at=timezone.now(), whatsapp_paused_reason="token expired (190)"
    )
    # session, user, organization, campaigns with their metrics, sends per day, NPS, replies per store
    with django_assert_max_num_queries(8):
        response = admin_client.get(_dashboard_url(org))
    assert response.status_code == 200
    html = response.content.decode()

    assert "Liquidação de Inverno" in html and "Newsletter" in html
    assert "Campanha Antiga" not in html
    row = re.search(rf'<tr data-campaign="{board["recent"].pk}">(.*?)</tr>', html, re.S)
    assert row is not None
    cells = re.findall(r"<td>(.*?)</td>", row.group(1), re.S)
    assert cells[1:3] == ["WhatsApp", "sent"]
    assert cells[4:] == ["1,500", "1,234", "1,200", "800", "90", "7"]
    # The cost in its own currency (the rate card's, US dollars), never as reais.
    assert '<td data-money="cost" data-currency="USD">US$77.13</td>' in row.group(1)
    # shown in the organization's time zone, as English writes it ("5 p.m." on the hour, "noon": one
    # run in sixty started on the hour, which a hand-made "5:00 p.m." failed)
    started = board["recent"].started_at.astimezone(SAO_PAULO)
    assert cells[3] == dateformat.format(started, "m/d/Y P")
    assert cells[3].startswith(f"{started:%m/%d/%Y} ")

    centro = re.search(rf'<tr data-store="{shop.centro.pk}">(.*?)</tr>', html, re.S)
    assert centro is not None and 'data-nps="40.0"' in centro.group(1)
    assert re.search(r'<tr data-store="all".*?data-nps="16.7"', html, re.S)

    assert 'data-channel="whatsapp"' in html and "token expired (190)" in html
    assert 'data-channel="email"' not in html

    script = re.search(r'<script id="organization-chart-data" type="application/json">(.*?)</script>', html)
    assert script is not None
    chart = json.loads(script.group(1))
    assert len(chart["days"]) == 30
    assert chart["days"][-1] == timezone.now().astimezone(SAO_PAULO).date().isoformat()
    assert sum(chart["whatsapp_sent"]) == 1234 and sum(chart["email_sent"]) == 48


def test_the_dashboard_in_portuguese_formats_numbers_the_brazilian_way(shop: Shop, board: dict, admin_client):
    html = admin_client.get(_dashboard_url(shop.org)).content.decode()
    row = re.search(rf'<tr data-campaign="{board["recent"].pk}">(.*?)</tr>', html, re.S)
    assert row is not None
    assert "<td>1.234</td>" in row.group(1)
    assert '<td data-money="cost" data-currency="USD">US$\u00a077,13</td>' in row.group(1)


def test_the_organization_page_links_the_dashboard(shop: Shop, admin_client):
    html = admin_client.get(f"/admin/crm/organization/{shop.org.pk}/change/").content.decode()
    assert f'href="{_dashboard_url(shop.org)}"' in html
    assert 'class="object-tools"' in html


def test_an_empty_dashboard_says_so(world, admin_client, english):
    html = admin_client.get(_dashboard_url(world["org"])).content.decode()
    assert 'id="dashboard-no-campaigns"' in html and 'id="dashboard-no-nps"' in html


# -- the chart library -------------------------------------------------------------------------------


def test_the_chart_library_is_vendored_and_served_by_whitenoise(db, settings, tmp_path: Path):
    found = finders.find(UPLOT)
    assert found and Path(found).stat().st_size > 30_000
    assert Path(found).with_name("LICENSE").read_text().startswith("The MIT License")

    settings.STATIC_ROOT = tmp_path
    call_command("collectstatic", interactive=False, verbosity=0)
    response = Client().get(f"/static/{UPLOT}")  # a new client: WhiteNoise reads the new root
    assert response.status_code == 200
    assert b"uPlot" in b"".join(response.streaming_content)  # type: ignore[attr-defined]
    assert response["Content-Type"].startswith(("application/javascript", "text/javascript"))


def test_the_dashboard_is_a_managers_home_page_and_an_operators_index_stays_the_apps(
    shop: Shop, board: dict, admin_client, english
):
    manager = User.objects.create_user("gerente-home", password="pw-gerente-1234", is_staff=True)
    Membership.objects.create(user=manager, organization=shop.org, role=Membership.Role.MANAGER)
    client = Client()
    client.force_login(manager)
    home = client.get("/admin/").content.decode()
    assert 'id="home-dashboard"' in home and "Liquidação de Inverno" in home
    assert re.search(r'<tr data-store="all".*?data-nps="16.7"', home, re.S)
    assert "/admin/campaigns/campaign/" in home  # the apps stay below it
    operator = admin_client.get("/admin/").content.decode()
    assert 'id="home-dashboard"' not in operator and "/admin/queues/" in operator


def test_a_finished_campaigns_chart_stops_at_now_even_with_a_late_stamp_ahead(shop: Shop):
    campaign = _campaign(shop.org, timezone.now() - timedelta(hours=2), name="Relógio")
    Campaign.objects.filter(pk=campaign.pk).update(
        status=Campaign.Status.SENT, finished_at=timezone.now() + timedelta(hours=3)
    )
    campaign.refresh_from_db()
    data = dashboards.campaign_series(campaign=campaign)
    if data["timestamps"]:
        assert data["timestamps"][-1] <= timezone.now().timestamp()
    assert not data.get("x_range") or data["x_range"][1] <= timezone.now().timestamp() + 1


def test_the_live_status_writes_its_eta_in_seconds_as_its_script_does(
    world, admin_client, english, monkeypatch
):
    from campaigns import selectors

    campaign = _campaign(world["org"], timezone.now() - timedelta(minutes=5))
    real = selectors.campaign_status
    monkeypatch.setattr(
        selectors, "campaign_status", lambda campaign: {**real(campaign=campaign), "eta_seconds": 1234}
    )
    html = admin_client.get(f"/admin/campaigns/campaign/{campaign.pk}/change/").content.decode()
    assert '<td data-field="eta_seconds">1,234 s</td>' in html  # not a bare "1234"


def test_a_stamp_ahead_of_the_clock_counts_in_the_last_bucket_so_the_series_add_up(world):
    org = world["org"]
    now = timezone.now()
    campaign = _campaign(org, now - timedelta(minutes=3), finished_at=now - timedelta(minutes=2))
    people = _customers(org, 3)
    ahead = now + timedelta(minutes=2)  # another clock's stamp: a sent_at and a read_at ahead of ours
    WhatsappMessage.objects.bulk_create(
        [
            WhatsappMessage(
                campaign=campaign,
                organization=org,
                customer=c,
                status="read",
                sent_at=now - timedelta(minutes=3) if i else ahead,
                read_at=ahead,
                cost=Decimal("0.0625"),
            )
            for i, c in enumerate(people)
        ]
    )

    data = dashboards.campaign_series(campaign=campaign)

    assert data["timestamps"][-1] <= now.timestamp() + 60
    assert {k: sum(v) for k, v in data["series"].items()} == data["totals"]
    assert data["totals"]["read"] == 3 and data["series"]["read"][-1] == 3
    assert data["cost"][-1] == pytest.approx(0.1875) and Decimal(data["cost_total"]) == Decimal("0.1875")
