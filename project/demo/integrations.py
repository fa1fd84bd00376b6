"""The demo organization's provider settings: a WhatsApp number per demo store, pointed at the
Meta sandbox with the token it accepts, demo prices, and email through an SMTP server. Demo data
only: the composition root (project/) imports it, never a production module (the `demo` import
contract)."""

from __future__ import annotations

from crm.models import Organization, Store
from crm.services import organizations_resume
from integrations.models import ChatwootAccount, EmailSettings, WhatsappNumber, WhatsappPrice
from project.demo.crm import DEMO_STORES

DEMO_PHONE_NUMBER_ID = "100000000000001"
DEMO_ACCESS_TOKEN = "demo-access-token"  # noqa: S105 - the sandbox's token, not a real credential
# The business account the sandbox serves its templates under (sandbox.SandboxConfig.waba_id): the
# demo's numbers carry it, so `demo` syncs the demo's templates as a real account's are.
DEMO_WABA_ID = "102290129340398"


def demo_store_phone_number_id(index: int) -> str:
    """The sandbox phone number id of the demo organization's store number `index` (0: the
    organization's own, DEMO_PHONE_NUMBER_ID)."""
    return f"{int(DEMO_PHONE_NUMBER_ID) + index}"


# The sandbox accepts the demo token for these numbers (manage.py up tells it about each).
DEMO_PHONE_NUMBER_IDS = tuple(demo_store_phone_number_id(i) for i in range(len(DEMO_STORES)))


def whatsapp_number_demo(*, organization: Organization, graph_url: str) -> WhatsappNumber:
    """Give each demo store a WhatsApp number pointed at `graph_url` (the sandbox), the first store's
    being the organization's (campaigns send from it by default); returns that one. Safe to run twice."""
    numbers = [
        _demo_number(organization, store, index, graph_url)
        for index, store in enumerate(organization.stores.order_by("erp_code")[: len(DEMO_STORES)])
    ]
    # Demo rates (USD per marketing message); real ones come from the pricing sync.
    for country, price in (("BR", "0.0625"), ("*", "0.0700")):
        WhatsappPrice.objects.update_or_create(
            category="marketing", country=country, defaults={"price": price}
        )
    return numbers[0]


def _demo_number(organization: Organization, store: Store, index: int, graph_url: str) -> WhatsappNumber:
    phone_number_id = demo_store_phone_number_id(index)
    number = WhatsappNumber.objects.filter(phone_number_id=phone_number_id).first() or WhatsappNumber(
        phone_number_id=phone_number_id
    )
    number.organization = organization
    number.store = store
    number.display_phone_number = f"+55119400000{index:02d}"
    number.business_account_id = DEMO_WABA_ID
    number.graph_url = graph_url
    number.paused_at, number.paused_reason = None, ""
    number.set_access_token(DEMO_ACCESS_TOKEN)
    number.save()
    Store.objects.filter(pk=store.pk).update(whatsapp_number=number)
    return number


DEMO_CHATWOOT_TOKEN = "chatwoot-demo-api-access-token"  # noqa: S105 - the sandbox's, not a real one


def chatwoot_account_demo(*, organization: Organization, base_url: str) -> ChatwootAccount:
    """Point the demo organization's Chatwoot at `base_url` (the sandbox: account 1, inbox 1). Safe to
    run twice."""
    account = ChatwootAccount.objects.filter(organization=organization).first() or ChatwootAccount(
        organization=organization
    )
    account.base_url, account.account_id, account.inbox_id, account.enabled = base_url, 1, 1, True
    account.set_api_token(DEMO_CHATWOOT_TOKEN)
    account.save()
    return account


def email_settings_demo(*, organization: Organization, host: str, port: int) -> EmailSettings:
    """Point the demo organization's email at an SMTP server with no TLS and no login (the sandbox).

    Safe to run twice. The rate is high so the demo finishes quickly; set it in the admin."""
    email_settings, _ = EmailSettings.objects.update_or_create(
        organization=organization,
        defaults={
            "provider": EmailSettings.Provider.SMTP,
            "host": host,
            "port": port,
            "security": EmailSettings.Security.NONE,
            "username": "",
            "password_encrypted": "",
            "sender_name": organization.name,
            "sender_email": "ofertas@loja-demo.example.com.br",
            "unsubscribe_mailto": "descadastro@loja-demo.example.com.br",
            "messages_per_minute": 6000,
        },
    )
    if organization.email_paused_at:
        organizations_resume(organization_ids=[organization.pk], channel="email")
    return email_settings
