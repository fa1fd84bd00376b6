from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator

import pytest

from campaigns.models import Campaign
from crm.models import Customer, Organization, Store
from integrations.models import WhatsappNumber, WhatsappPrice
from project.sandboxes.whatsapp import SandboxServer

PHONE_NUMBER_ID = "109876543210"
TOKEN = "EAAG-sandbox-token-for-tests-0123456789"
META_SECRET = "meta-app-secret-for-tests"


def meta_signature(body: bytes) -> str:
    return "sha256=" + hmac.new(META_SECRET.encode(), body, hashlib.sha256).hexdigest()


@pytest.fixture
def meta(client, settings):
    """Post a body to Meta's webhook, signed with the app's secret, as Meta would; its JSON answer."""
    settings.WHATSAPP_APP_SECRET = META_SECRET

    def post(body: bytes):
        response = client.post(
            "/webhooks/whatsapp/",
            data=body,
            content_type="application/json",
            HTTP_X_HUB_SIGNATURE_256=meta_signature(body),
        )
        assert response.status_code == 200, response.content
        return response.json()

    return post


@pytest.fixture
def sandbox() -> Iterator[SandboxServer]:
    with SandboxServer(host="127.0.0.1", port=0, numbers={PHONE_NUMBER_ID: TOKEN}) as server:
        yield server


def whatsapp_number(
    org: Organization,
    sandbox: SandboxServer,
    *,
    store: Store | None = None,
    phone_number_id: str = PHONE_NUMBER_ID,
    display: str = "+5511940000000",
) -> WhatsappNumber:
    """The organization's WhatsApp number, pointed at the sandbox (unpaced)."""
    number = WhatsappNumber(
        organization=org,
        store=store,
        display_phone_number=display,
        phone_number_id=phone_number_id,
        graph_url=sandbox.url,
        messages_per_second=0,
    )
    number.set_access_token(TOKEN)
    number.save()
    return number


@pytest.fixture
def wa(transactional_db, sandbox, settings) -> dict:
    """An organization with a WhatsApp number pointed at the sandbox, and a campaign factory."""
    settings.WHATSAPP_BATCH_SIZE = 50
    org = Organization.objects.create(name="Loja Teste", slug="teste")
    store = Store.objects.create(organization=org, erp_code="001", name="Centro")
    number = whatsapp_number(org, sandbox, store=store)
    WhatsappPrice.objects.create(category="marketing", country="BR", price="0.0625")
    WhatsappPrice.objects.create(category="marketing", country="*", price="0.07")

    def customers(n: int, start: int = 0, **fields) -> list[Customer]:
        return Customer.objects.bulk_create(
            [
                Customer(
                    marketing_consent=True,
                    organization=org,
                    erp_id=f"C{i}",
                    name=fields.get("name", f"Cliente{i} Silva"),
                    phone=fields.get("phone", f"+55119{80000000 + i:08d}"),
                    email=f"c{i}@example.com.br",
                )
                for i in range(start, start + n)
            ]
        )

    def campaign(**fields) -> Campaign:
        defaults = dict(
            organization=org,
            name="Black Friday",
            whatsapp_number=number,
            template_name="promo_bf",
            template_variables=["first_name"],
            redirect_url="https://loja.example.com.br/bf",
            redirect_button_index=0,
            unsubscribe_button_index=1,
        )
        return Campaign.objects.create(**{**defaults, **fields})

    return {"org": org, "store": store, "number": number, "customers": customers, "campaign": campaign}
