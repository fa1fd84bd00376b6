"""Writes on integration settings."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict
from datetime import datetime

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from crm import jobs, queues
from crm.services import REASON_MAX
from integrations import http
from integrations.errors import IntegrationError
from integrations.models import WhatsappNumber, WhatsappPrice, WhatsappTemplate
from integrations.whatsapp.pricing import parse_rate_card
from integrations.whatsapp.templates import Template, fetch_templates

logger = logging.getLogger(__name__)


def whatsapp_numbers_pause(*, organization_id: int, number_ids: Iterable[int], reason: str) -> int:
    """Stop the sends of these numbers of the organization until an operator resumes them: Meta
    refused the number itself (its token, registration, display name, quality); the organization's
    other numbers go on. An existing pause, its time and reason, is kept. Returns how many this call
    paused, each logged as an error."""
    paused = 0
    for number_id in sorted(set(number_ids)):  # a batch's few numbers: a statement and a log each
        numbers = WhatsappNumber.objects.filter(
            organization_id=organization_id, pk=number_id, paused_at__isnull=True
        )
        if numbers.update(paused_at=timezone.now(), paused_reason=reason[:REASON_MAX]):
            paused += 1
            logger.error(
                "WhatsApp number %s paused: %s", number_id, reason, extra={"organization_id": organization_id}
            )
    return paused


def whatsapp_numbers_resume(*, numbers: QuerySet[WhatsappNumber]) -> int:
    """Clear the pause of these numbers (an operator fixed its cause); returns how many were paused.
    Their waiting send batches look again within a minute."""
    return numbers.filter(paused_at__isnull=False).update(paused_at=None, paused_reason="")


def whatsapp_prices_sync(*, url: str) -> dict[str, int]:
    """Fetch the rate card at `url` and upsert every price; returns {"rates": n, "skipped": m}."""
    with http.client() as client:
        try:
            response = client.get(url)
        except httpx.HTTPError as exc:  # timeouts, refused connections: retry later
            raise IntegrationError(f"rate card unreachable: {exc}", retryable=True) from exc
    if response.status_code != 200:
        raise IntegrationError(
            f"rate card answered HTTP {response.status_code}",
            retryable=response.status_code >= 500,
            status=response.status_code,
        )
    rates, problems = parse_rate_card(response.text)
    for problem in problems:
        logging.getLogger(__name__).warning("rate card %s: %s", url, problem)
    WhatsappPrice.objects.bulk_create(
        [
            WhatsappPrice(country=r.country, category=r.category, price=r.price, currency=r.currency)
            for r in rates
        ],
        update_conflicts=True,
        unique_fields=["category", "country"],
        update_fields=["price", "currency", "updated_at"],
    )
    if rates:
        # A card in another currency replaces the old one whole: no price is left in the old currency.
        WhatsappPrice.objects.exclude(currency=rates[0].currency).delete()
    return {"rates": len(rates), "skipped": len(problems)}


def whatsapp_price_currency() -> str:
    """The rate card's currency (ISO 4217; the card has one), Meta's USD when it is empty."""
    return WhatsappPrice.objects.order_by("pk").values_list("currency", flat=True).first() or "USD"


def _template_row(organization_id: int, waba_id: str, template: Template, now: datetime) -> WhatsappTemplate:
    return WhatsappTemplate(
        organization_id=organization_id,
        business_account_id=waba_id,
        meta_id=template.meta_id,
        name=template.name,
        language=template.language,
        status=template.status,
        category=template.category,
        header_format=template.header_format,
        header_text=template.header_text,
        body=template.body,
        footer=template.footer,
        buttons=[{**asdict(b), "dynamic": b.dynamic} for b in template.buttons],
        variable_count=len(template.variables),
        unsupported_reason=template.sendable_reason,
        components=template.components,
        synced_at=now,
    )


def whatsapp_accounts(*, organization_id: int | None = None) -> list[WhatsappNumber]:
    """One number per (organization, business account) to read its templates with: the oldest."""
    numbers = WhatsappNumber.objects.exclude(business_account_id="").order_by(
        "organization_id", "business_account_id", "pk"
    )
    if organization_id is not None:
        numbers = numbers.filter(organization_id=organization_id)
    return list(numbers.distinct("organization_id", "business_account_id"))


def whatsapp_templates_sync(*, number: WhatsappNumber) -> dict[str, int]:
    """Fetch every template of the number's business account from Meta and store them as Meta has
    them now: new ones added, changed ones updated, ones Meta no longer lists deleted. Safe to run
    twice. Returns {"templates": n, "approved": a, "removed": r}; raises IntegrationError."""
    templates = fetch_templates(
        base_url=number.graph_url or settings.WHATSAPP_GRAPH_URL,
        version=settings.WHATSAPP_GRAPH_VERSION,
        waba_id=number.business_account_id,
        access_token=number.get_access_token(),
    )
    now = timezone.now()
    unique = {(t.name, t.language): t for t in templates}  # a page repeated by Meta counts once
    rows = [
        _template_row(number.organization_id, number.business_account_id, t, now) for t in unique.values()
    ]
    with transaction.atomic():
        WhatsappTemplate.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["organization", "business_account_id", "name", "language"],
            update_fields=[
                f.name for f in WhatsappTemplate._meta.concrete_fields if f.name not in _TEMPLATE_KEY
            ],
        )
        removed, _by_model = (
            WhatsappTemplate.objects.filter(
                organization_id=number.organization_id, business_account_id=number.business_account_id
            )
            .exclude(synced_at=now)
            .delete()
        )
    approved = sum(1 for r in rows if r.status == WhatsappTemplate.Status.APPROVED)
    return {"templates": len(rows), "approved": approved, "removed": removed}


_TEMPLATE_KEY = {"id", "organization", "business_account_id", "name", "language"}


def whatsapp_templates_sync_all(*, organization_id: int | None = None) -> dict[str, int]:
    """Sync the templates of every business account (of one organization, or all); an account that
    fails is logged and counted, the others go on. Returns the summed counts and "failed"."""
    totals = {"accounts": 0, "templates": 0, "approved": 0, "removed": 0, "failed": 0}
    for number in whatsapp_accounts(organization_id=organization_id):
        try:
            counts = whatsapp_templates_sync(number=number)
        except IntegrationError as exc:
            totals["failed"] += 1
            logger.warning(
                "templates of business account %s not synced: %s",
                number.business_account_id,
                exc,
                extra={"organization_id": number.organization_id},
            )
            continue
        totals["accounts"] += 1
        for key in ("templates", "approved", "removed"):
            totals[key] += counts[key]
    return totals


def whatsapp_templates_sync_enqueue(*, organization_id: int, delay: float | None = None) -> str:
    """Sync one organization's templates in a job (the admin's button; the demo, `delay` seconds
    later, once its sandbox listens); one at a time per organization."""
    return jobs.enqueue(
        "integrations.tasks.whatsapp_templates_sync_organization",
        queue=queues.MAINTENANCE,
        kwargs={"organization_id": organization_id},
        job_id=jobs.make_job_id("whatsapp-templates", organization_id),
        unique=True,
        result_ttl=0,
        organization_id=organization_id,
        delay=delay,
    )
