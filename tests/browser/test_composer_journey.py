"""The composer in a real browser against `manage.py up`: a manager's templates synced from the Meta
sandbox, one picked from the list, its variables mapped from dropdowns, the message previewed for a
real customer, and a test send that reaches the sandbox."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import STAFF_PASSWORD, STAFF_USERNAME, Stack, log_in, screenshot
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

WABA = "102290129340398"


def _synced(stack: Stack) -> tuple[int, int, str]:
    """The demo's first number given its business account; its templates synced from the sandbox."""
    from integrations.models import WhatsappNumber
    from integrations.services import whatsapp_templates_sync

    number = WhatsappNumber.objects.filter(organization_id=stack.ids["organization"]).order_by("pk").first()
    assert number is not None
    WhatsappNumber.objects.filter(pk=number.pk).update(business_account_id=WABA)
    number.refresh_from_db()
    assert whatsapp_templates_sync(number=number)["approved"] >= 1
    return number.pk, number.organization_id, number.graph_url


def test_a_manager_composes_previews_and_test_sends_a_campaign(
    stack: Stack, new_page: Callable[..., Page]
) -> None:
    from campaigns.models import Campaign, TestSend
    from integrations.models import WhatsappTemplate

    number_id, org_id, graph_url = stack.orm.run(_synced, stack)
    template_id = stack.orm.run(lambda: WhatsappTemplate.objects.get(name="aniversario", language="pt_BR").pk)
    page = new_page(width=1366, height=900)
    log_in(page, STAFF_USERNAME, STAFF_PASSWORD)
    page.goto(f"/admin/campaigns/campaign/add/?organization={org_id}")
    page.select_option("select[name=organization]", str(org_id))
    page.fill("input[name=name]", "Aniversariantes")
    page.select_option("select[name=channel]", "whatsapp")
    page.select_option("select[name=whatsapp_number]", str(number_id))
    assert "black_friday" not in page.locator("select[name=whatsapp_template]").inner_text()
    page.select_option("select[name=whatsapp_template]", str(template_id))
    expect(page.locator("input[name=template_name]")).to_have_value("aniversario")
    expect(page.locator("#id_template_variables_1")).to_be_visible()
    expect(page.locator("#id_template_variables_2")).to_be_hidden()
    page.select_option("select[name=template_variables_0]", "first_name")
    page.select_option("select[name=template_variables_1]", "store_name")
    expect(page.locator("#template-body")).to_contain_text("seu presente está na")
    screenshot(page, "composer-template-picked")
    with page.expect_navigation():
        page.click("input[name=_continue]")
    pk = stack.orm.run(lambda: Campaign.objects.get(name="Aniversariantes").pk)
    assert stack.orm.run(lambda: Campaign.objects.get(pk=pk).template_variables) == [
        "first_name",
        "store_name",
    ]

    preview = page.locator("#campaign-preview")
    expect(preview).to_contain_text("seu presente está na")
    screenshot(page, "composer-preview")

    page.fill("#test-send-to", "(11) 99000-0000")
    with page.expect_navigation():
        page.click("#test-send button[type=submit]")
    wait_for(
        lambda: stack.orm.run(lambda: TestSend.objects.filter(campaign_id=pk, status="sent").exists()),
        timeout=120,
        what="the test send is sent",
    )
    sent = httpx.get(f"{graph_url}/_sandbox/messages", params={"to": "5511990000000"}, timeout=10).json()
    assert sent["count"] == 1
    assert sent["messages"][0]["template"]["name"] == "aniversario"
    page.reload()
    expect(page.locator("#test-sends")).to_contain_text("+5511990000000")
    screenshot(page, "composer-test-sent")
    assert stack.orm.run(lambda: Campaign.objects.get(pk=pk).status) == "draft"
