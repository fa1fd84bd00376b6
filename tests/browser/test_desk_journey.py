"""The issue's "done when", in a real browser against `manage.py up`: the demo manager picks a synced
template, maps its variables, sees the message and the audience with its skips and cost, confirms,
watches it send, and sees the cost in the right currency and the revenue on the campaign and the
customer pages — with no imported customer messaged without consent."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import MANAGER_PASSWORD, MANAGER_USERNAME, Stack, log_in, screenshot
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


def _world(stack: Stack) -> dict:
    """Two customers imported without a consent (as the ERP's are); the demo's synced templates."""
    from crm.models import Customer
    from integrations.models import WhatsappNumber, WhatsappTemplate

    org_id = stack.ids["organization"]
    for i in range(2):
        Customer.objects.create(organization_id=org_id, name=f"Importado {i}", phone=f"+551197777000{i}")
    wait_for(
        lambda: WhatsappTemplate.objects.filter(organization_id=org_id, name="promo_demo").exists(),
        timeout=180,
        what="the demo's templates synced from the sandbox",
    )
    number = WhatsappNumber.objects.filter(organization_id=org_id).order_by("pk").first()
    assert number is not None
    template = WhatsappTemplate.objects.get(organization_id=org_id, name="promo_demo", language="pt_BR")
    consenting = Customer.objects.filter(organization_id=org_id, marketing_consent=True).exclude(phone="")
    return {
        "org": org_id,
        "number": number.pk,
        "graph_url": number.graph_url,
        "template": template.pk,
        "receives": consenting.count(),
    }


def _sell(campaign_id: int) -> tuple[int, str]:
    """A sale by a customer the campaign reached (through the ORM: the sales hook attributes it)."""
    from django.utils import timezone

    from campaigns.models import WhatsappMessage
    from crm.models import Sale

    message = WhatsappMessage.objects.filter(
        campaign_id=campaign_id, status__in=["sent", "delivered", "read"]
    )
    reached = message.select_related("customer").first()
    assert reached is not None
    store = reached.customer.organization.stores.order_by("pk").first()
    assert store is not None
    Sale.objects.create(
        organization_id=reached.organization_id,
        store=store,
        customer=reached.customer,
        erp_id="journey-1",
        total=Decimal("250.00"),
        sold_at=timezone.now(),
    )
    return reached.customer_id, reached.phone


def test_a_manager_composes_sees_the_audience_confirms_and_sees_cost_and_revenue(
    stack: Stack, new_page: Callable[..., Page]
) -> None:
    from campaigns.models import Campaign, WhatsappMessage
    from crm.models import Customer

    world = stack.orm.run(_world, stack)
    page = new_page(width=1366, height=900)
    log_in(page, MANAGER_USERNAME, MANAGER_PASSWORD)
    page.goto(f"/admin/campaigns/campaign/add/?organization={world['org']}")
    page.select_option("select[name=organization]", str(world["org"]))
    page.fill("input[name=name]", "Ofertas da semana")
    page.select_option("select[name=channel]", "whatsapp")
    page.select_option("select[name=whatsapp_number]", str(world["number"]))
    page.select_option("select[name=whatsapp_template]", str(world["template"]))
    expect(page.locator("input[name=template_name]")).to_have_value("promo_demo")
    page.select_option("select[name=template_variables_0]", "first_name")
    page.select_option("select[name=template_variables_1]", "store_name")
    page.fill("input[name=header_image_url]", "https://loja.example.com.br/ofertas.jpg")
    page.fill("input[name=redirect_url]", "https://loja.example.com.br/ofertas")
    page.fill("input[name=redirect_button_index]", "0")
    expect(page.locator("#template-body")).to_contain_text("preparou ofertas")
    with page.expect_navigation():
        page.click("input[name=_continue]")
    pk = stack.orm.run(lambda: Campaign.objects.get(name="Ofertas da semana").pk)

    # The message and the audience before the start: who receives it, who is skipped and why, the cost.
    expect(page.locator("#campaign-preview")).to_contain_text("preparou ofertas")
    preview = page.locator("#audience-preview")
    expect(preview.locator('[data-field="receives"]')).to_have_text(str(world["receives"]))
    assert int(preview.locator('[data-skip="no_consent"]').inner_text()) >= 2
    expect(preview.locator('[data-field="estimated-cost"]')).to_contain_text("US$")
    screenshot(page, "desk-audience")

    page.click("#lifecycle-start")
    expect(page.locator("#lifecycle-question")).to_contain_text(str(world["receives"]))
    expect(page.locator("#lifecycle-question")).to_contain_text("US$")
    screenshot(page, "desk-confirm-start")
    with page.expect_navigation():
        page.click("#lifecycle-yes")
    wait_for(
        lambda: stack.orm.run(lambda: Campaign.objects.get(pk=pk).status) == "sent",
        timeout=240,
        what="the campaign sent",
    )
    page.reload()
    expect(page.locator('#live-status [data-field="cost"]')).to_contain_text("US$")
    screenshot(page, "desk-sent")

    customer_id, phone = stack.orm.run(_sell, pk)
    page.reload()
    expect(page.locator(".field-attribution")).to_contain_text("250")
    page.goto(f"/admin/crm/customer/{customer_id}/change/")
    expect(page.locator(".field-profile")).to_contain_text("250")
    screenshot(page, "desk-customer-revenue")

    # Nobody without a consent was messaged: neither a sent message nor a request to Meta.
    def unconsented() -> tuple[int, list[str]]:
        ids = list(
            Customer.objects.filter(organization_id=world["org"], marketing_consent=False).values_list(
                "pk", flat=True
            )
        )
        reached = WhatsappMessage.objects.filter(campaign_id=pk, customer_id__in=ids).exclude(
            status="skipped"
        )
        phones = list(Customer.objects.filter(pk__in=ids).exclude(phone="").values_list("phone", flat=True))
        return reached.count(), phones

    count, phones = stack.orm.run(unconsented)
    assert count == 0 and len(phones) >= 2
    for p in phones:
        sent = httpx.get(f"{world['graph_url']}/_sandbox/messages", params={"to": p.lstrip("+")}, timeout=10)
        assert sent.json()["count"] == 0
    assert phone not in phones
