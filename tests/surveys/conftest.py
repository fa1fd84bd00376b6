"""The surveys' world: an organization with two stores and customers, its email settings pointed at a
loopback SMTP sandbox and a WhatsApp number pointed at the Meta sandbox."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from crm.models import Customer, Organization, Sale, Store
from integrations.models import EmailSettings, WhatsappNumber
from project.sandboxes.smtp import SmtpSandbox
from project.sandboxes.whatsapp import SandboxServer
from surveys.models import Survey

PHONE_NUMBER_ID = "109876500001"  # the Shopping store's own number
ORG_NUMBER_ID = "109876500099"  # the organization's first number (no store)
TOKEN = "EAAG-survey-sandbox-token-0123456789"
SENDER = "contato@lojateste.com.br"


@pytest.fixture
def smtp() -> Iterator[SmtpSandbox]:
    with SmtpSandbox() as server:
        yield server


@pytest.fixture
def meta() -> Iterator[SandboxServer]:
    with SandboxServer(
        host="127.0.0.1", port=0, numbers={PHONE_NUMBER_ID: TOKEN, ORG_NUMBER_ID: TOKEN}
    ) as server:
        yield server


class Shop:
    """An organization (surveys by email, 3 days after the sale, 90-day cool-down), two stores, customers."""

    def __init__(self) -> None:
        self.org = Organization.objects.create(
            name="Loja Teste",
            slug="loja-teste",
            survey_channel="email",
            survey_delay_days=3,
            survey_cooldown_days=90,
            survey_whatsapp_template="pesquisa_pos_venda",
        )
        self.centro = Store.objects.create(organization=self.org, erp_code="001", name="Centro")
        self.shopping = Store.objects.create(organization=self.org, erp_code="002", name="Shopping")
        self.ana = self.customer("Ana Silva", "ana@example.com.br", "+5511999990001")
        self.bruno = self.customer("Bruno Souza", "bruno@example.com.br", "+5521999990002")
        self._sales = 0

    def customer(self, name: str, email: str = "", phone: str = "", **fields: Any) -> Customer:
        fields.setdefault("marketing_consent", True)
        return Customer.objects.create(organization=self.org, name=name, email=email, phone=phone, **fields)

    def sale(
        self, customer: Customer | None, *, store: Store | None = None, sold_at: datetime | None = None
    ) -> Sale:
        """A sale created one by one (its post_save schedules the survey)."""
        self._sales += 1
        return Sale.objects.create(
            organization=self.org,
            store=store or self.centro,
            customer=customer,
            erp_id=f"V{self._sales:05d}",
            total=Decimal("199.90"),
            sold_at=sold_at or timezone.now(),
        )

    def due_survey(self, customer: Customer, **sale_fields: Any) -> Survey:
        """A sale whose survey is already due (sold `survey_delay_days` ago)."""
        sold_at = timezone.now() - timedelta(days=self.org.survey_delay_days, minutes=1)
        return Survey.objects.get(sale=self.sale(customer, sold_at=sold_at, **sale_fields))

    def use_channel(self, channel: str) -> None:
        Organization.objects.filter(pk=self.org.pk).update(survey_channel=channel)
        self.org.refresh_from_db()


@pytest.fixture
def shop(transactional_db) -> Shop:
    return Shop()


@pytest.fixture
def email_shop(shop: Shop, smtp: SmtpSandbox) -> Shop:
    """The shop sending through the SMTP sandbox (no rate limit, no login)."""
    EmailSettings.objects.create(
        organization=shop.org,
        host=smtp.host,
        port=smtp.port,
        security=EmailSettings.Security.NONE,
        sender_name="Loja Teste",
        sender_email=SENDER,
        messages_per_minute=0,
    )
    return shop


@pytest.fixture
def whatsapp_shop(shop: Shop, meta: SandboxServer) -> Shop:
    """The shop surveying by WhatsApp: the Shopping store has its own number, Centro has none."""
    shop.use_channel("whatsapp")
    for store, phone_number_id, display in (
        (None, ORG_NUMBER_ID, "+5511940000099"),
        (shop.shopping, PHONE_NUMBER_ID, "+5511940000000"),
    ):
        number = WhatsappNumber(
            organization=shop.org,
            store=store,
            display_phone_number=display,
            phone_number_id=phone_number_id,
            graph_url=meta.url,
            messages_per_second=0,
        )
        number.set_access_token(TOKEN)
        number.save()
    return shop


def reload(survey: Survey) -> Survey:
    return Survey.objects.get(pk=survey.pk)


Reload = Callable[[Survey], Survey]
