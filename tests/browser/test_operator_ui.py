"""What a new operator reads in the first hour, in a real browser at 1366x768 against `manage.py up`:
counts named for what they count (the campaign's "Now" states, the organization's cumulative
"Reached"), money with its currency, the 30-day chart drawing today, skip reasons that say what
happened, processed kept apart from sent, the campaign id in the list, the channel's own form
section, no dead "View site" link, the platform's blocks for operators only, metrics not addable,
and list pages without a horizontal scroll bar. One screenshot per point in var/screenshots/."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from django.utils import translation
from playwright.sync_api import Page, expect

from tests.browser.conftest import (
    DEMO_CUSTOMERS,
    MANAGER_PASSWORD,
    MANAGER_USERNAME,
    STAFF_PASSWORD,
    STAFF_USERNAME,
    Stack,
    log_in,
    screenshot,
)
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

WIDTH, HEIGHT = 1366, 768


def _no_horizontal_scroll(page: Page) -> None:
    """Neither the page nor the list's own box (.results scrolls sideways) is wider than the window."""
    overflow = page.evaluate(
        """() => [document.documentElement, ...document.querySelectorAll(".results")]
            .filter(e => e.scrollWidth > e.clientWidth + 1)
            .map(e => [e.className || e.tagName, e.scrollWidth, e.clientWidth])"""
    )
    assert overflow == [], f"{page.url}: wider than the window: {overflow}"


def _two_campaigns(stack: Stack) -> tuple[int, int]:
    """A WhatsApp campaign sent to every demo customer, then an email campaign the 24-hour block
    skips for all of them (the organization counts both channels together)."""
    from campaigns import lifecycle
    from campaigns.models import BodyFormat, Campaign, Channel
    from crm.models import Organization
    from integrations.models import WhatsappNumber, WhatsappTemplate

    org_id = stack.ids["organization"]
    Organization.objects.filter(pk=org_id).update(
        block_multiple_campaigns=True, contact_caps_scope=Organization.ContactCapsScope.SHARED
    )
    # The demo's templates are synced from the Meta sandbox (a job once it answers): one of them.
    wait_for(
        lambda: WhatsappTemplate.objects.filter(organization_id=org_id, name="promo_demo").exists(),
        timeout=180,
        what="the demo's templates synced",
    )
    whatsapp = lifecycle.campaign_start(
        campaign=Campaign.objects.create(
            organization_id=org_id,
            name="Liquidação de verão",
            whatsapp_number=WhatsappNumber.objects.filter(organization_id=org_id).order_by("pk").first(),
            template_name="promo_demo",
            template_variables=["first_name", "store_name"],
            header_image_url="https://loja.example.com.br/verao.jpg",
        )
    )
    wait_for(
        lambda: Campaign.objects.get(pk=whatsapp.pk).status == Campaign.Status.SENT,
        timeout=180,
        what="the WhatsApp campaign to be sent",
    )
    email = lifecycle.campaign_start(
        campaign=Campaign.objects.create(
            organization_id=org_id,
            name="Newsletter de verão",
            channel=Channel.EMAIL,
            email_subject="Novidades",
            email_body_format=BodyFormat.HTML,
            email_body="<p>Olá {{ first_name }}</p>",
        )
    )
    wait_for(
        lambda: Campaign.objects.get(pk=email.pk).status == Campaign.Status.SENT,
        timeout=180,
        what="the email campaign to complete",
    )
    return whatsapp.pk, email.pk


def _sales_after(stack: Stack, campaign_id: int) -> int:
    """Two of the campaign's customers buy now, after its message: sales saved as the admin saves
    them (each attributed on save). Returns how many were made."""
    from decimal import Decimal

    from django.utils import timezone

    from campaigns.models import WhatsappMessage
    from crm.models import Sale, Store
    from flows.models import Flow

    store = Store.objects.filter(organization_id=stack.ids["organization"]).first()
    assert store is not None
    # The demo's post-purchase flow would thank these buyers: its sends would join today's bars.
    Flow.objects.filter(organization_id=stack.ids["organization"]).update(paused=True)
    messages = WhatsappMessage.objects.filter(campaign_id=campaign_id, sent_at__isnull=False)[:2]
    for i, message in enumerate(messages):
        assert message.sent_at is not None
        Sale.objects.create(
            organization_id=stack.ids["organization"],
            store=store,
            customer_id=message.customer_id,
            erp_id=f"UI-SALE-{i}",
            total=Decimal("149.90") * (i + 1),
            sold_at=max(timezone.now(), message.sent_at),  # not in the future: the 30 days end now
        )
    return len(messages)


def test_a_new_operator_reads_the_pages_right(stack: Stack, new_page: Callable[..., Page]) -> None:
    from campaigns import caps

    whatsapp_id, email_id = stack.orm.run(_two_campaigns, stack)
    sales = stack.orm.run(_sales_after, stack, whatsapp_id)
    assert sales == 2
    org_id = stack.ids["organization"]
    page = new_page(width=WIDTH, height=HEIGHT)
    log_in(page, STAFF_USERNAME, STAFF_PASSWORD)

    # No "View site" leading to a 404; "/" itself leads to the admin.
    expect(page.locator("#user-tools")).to_be_visible()
    expect(page.locator("#user-tools a", has_text=re.compile("site", re.I))).to_have_count(0)
    page.goto("/")
    assert page.url.rstrip("/").endswith("/admin") or "/admin/" in page.url
    screenshot(page, "ui-index-operator")

    # The list: the id the commands take, and processed apart from sent.
    page.goto("/admin/campaigns/campaign/")
    expect(page.locator("#result_list th.column-id")).to_have_count(1)
    row = page.locator(f"#result_list tr:has(input[name=_selected_action][value='{email_id}'])")
    expect(row.locator("td.field-id, th.field-id")).to_have_text(str(email_id))
    progress = row.locator("td.field-progress")
    expect(progress).to_contain_text(f"{DEMO_CUSTOMERS}/{DEMO_CUSTOMERS}")
    expect(progress).to_contain_text("· 0 ")
    _no_horizontal_scroll(page)
    screenshot(page, "ui-campaign-list")

    # The email campaign that skipped everyone: processed 100 %, sent 0, and why.
    page.goto(f"/admin/campaigns/campaign/{email_id}/change/")
    expect(page.locator("#live-status [data-field=progress]")).to_have_text(re.compile(r"^100([.,]0)?%$"))
    expect(page.locator("#live-status [data-field=reached]")).to_have_text("0")
    expect(page.locator("#live-now caption")).to_be_visible()
    expect(page.locator("#live-now [data-count=skipped]")).to_have_text(str(DEMO_CUSTOMERS))
    expect(page.locator("fieldset.channel-whatsapp")).to_have_count(0)  # an email campaign's form
    expect(page.locator("fieldset.channel-email")).to_have_count(1)
    screenshot(page, "ui-campaign-skipped-everyone")

    page.goto(f"/admin/campaigns/emailmessage/?campaign={email_id}")
    # The stored reason, shown in the page's language (caps.skip_reason_label).
    with translation.override(page.evaluate("document.documentElement.lang")):
        shown = caps.skip_reason_label(caps.SENT_WITHIN_24H)
    expect(page.locator("#result_list tbody")).to_contain_text(shown)
    _no_horizontal_scroll(page)
    screenshot(page, "ui-skip-reasons")

    # The WhatsApp campaign: "Now" states, cost in reais, a time axis in the organization's zone.
    page.goto(f"/admin/campaigns/campaign/{whatsapp_id}/change/")
    expect(page.locator("#live-now caption")).to_be_visible()
    # The cost in the rate card's currency (the sandbox's card is in US dollars), never as reais.
    expect(page.locator("#live-status [data-field=cost]")).to_have_text(re.compile(r"^US\$\s?\d+,\d{2}\b"))
    expect(page.locator("fieldset.channel-email")).to_have_count(0)
    expect(page.locator("#campaign-chart-events canvas")).to_have_count(1)
    screenshot(page, "ui-campaign-now-and-money")
    # What it sold: R$ 149,90 + R$ 299,80 from two of the customers it reached.
    sold = page.locator("#campaign-attribution")
    expect(sold.locator("[data-field=revenue]")).to_have_text(re.compile(r"^R\$\s?449,70$"))
    expect(sold.locator("[data-field=conversions]")).to_have_text("2")
    expect(sold.locator("[data-field=buyers]")).to_have_text("2")
    sold.scroll_into_view_if_needed()
    screenshot(page, "ui-campaign-revenue")

    # The add form shows the chosen channel's section only.
    page.goto("/admin/campaigns/campaign/add/")
    page.select_option("select[name=channel]", "email")
    expect(page.locator("fieldset.channel-whatsapp")).to_be_hidden()
    expect(page.locator("fieldset.channel-email")).to_be_visible()
    screenshot(page, "ui-campaign-add-email")
    page.select_option("select[name=channel]", "whatsapp")
    expect(page.locator("fieldset.channel-email")).to_be_hidden()
    expect(page.locator("fieldset.channel-whatsapp")).to_be_visible()
    # A WhatsApp campaign sends from its own number or from each customer's store number.
    sender = page.locator("select[name=sender]")
    expect(sender).to_be_visible()
    values = sender.locator("option").evaluate_all("os => os.map(o => o.value)")
    assert sorted(values) == ["campaign", "store"]
    sender.select_option("store")
    sender.scroll_into_view_if_needed()
    screenshot(page, "ui-campaign-sender")

    # The organization's 30 days: cumulative "Reached", money, today's bars.
    page.goto(f"/admin/crm/organization/{org_id}/dashboard/")
    expect(page.locator("#dashboard-reached")).to_be_visible()
    cost = page.locator(f"#dashboard-campaigns tr[data-campaign='{whatsapp_id}'] td[data-money=cost]")
    expect(cost).to_have_text(re.compile(r"^US\$\s?\d+,\d{2}\b"))  # the rate card's currency
    chart = json.loads(page.locator("#organization-chart-data").inner_text())
    assert chart["whatsapp_sent"][-1] == DEMO_CUSTOMERS  # today, the window's last day
    expect(page.locator("#organization-chart-sent canvas")).to_have_count(1)
    screenshot(page, "ui-organization-dashboard")
    revenue = page.locator(f"#dashboard-campaigns tr[data-campaign='{whatsapp_id}'] td[data-field=revenue]")
    expect(revenue).to_have_text(re.compile(r"^R\$\s?449,70$"))
    stores = page.locator("#dashboard-revenue-stores td[data-field=revenue]")
    expect(stores.first).to_have_text(re.compile(r"^R\$\s?449,70$"))
    page.locator("#dashboard-revenue-stores").scroll_into_view_if_needed()
    screenshot(page, "ui-organization-revenue")

    # Metrics are the send jobs' to write: nothing to add by hand.
    page.goto("/admin/campaigns/campaignmetric/")
    expect(page.locator(".object-tools a.addlink")).to_have_count(0)
    _no_horizontal_scroll(page)
    screenshot(page, "ui-campaign-metrics")
    response = page.goto("/admin/campaigns/campaignmetric/add/")
    assert response is not None and response.status == 403

    # Every list a new operator opens fits a 1366-px screen.
    for name, url in (
        ("customers", "/admin/crm/customer/"),
        ("sales", "/admin/crm/sale/"),
        ("whatsapp-messages", "/admin/campaigns/whatsappmessage/"),
        ("email-messages", "/admin/campaigns/emailmessage/"),
    ):
        page.goto(url)
        _no_horizontal_scroll(page)
        screenshot(page, f"ui-list-{name}")

    # An organization's manager: no platform blocks (queues, django-rq) on the index.
    manager = new_page(width=WIDTH, height=HEIGHT)
    log_in(manager, MANAGER_USERNAME, MANAGER_PASSWORD)
    expect(manager.locator("#operations")).to_have_count(0)
    expect(manager.locator("#content-main")).not_to_contain_text("Django RQ")
    expect(manager.locator("#content-main a[href*='/admin/django_rq/']")).to_have_count(0)
    screenshot(manager, "ui-index-manager")
