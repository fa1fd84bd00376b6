"""A campaign email's content: its subject and body compiled once per process, and a customer's variables."""

from __future__ import annotations

import functools

from campaigns.models import (
    Campaign,
)
from campaigns.variables import customer_variables
from crm.models import Customer
from messaging import email_render


@functools.lru_cache(maxsize=64)
def _compile(subject: str, body: str, body_format: str) -> email_render.CompiledEmail:
    return email_render.compile_email(subject=subject, body=body, body_format=body_format)


def compiled_email(campaign: Campaign) -> email_render.CompiledEmail:
    """The campaign's subject and body compiled once per process (and again only when edited)."""
    return _compile(campaign.email_subject, campaign.email_body, campaign.email_body_format)


def variables_for(customer: Customer, *, store_name: str, unsubscribe_url: str = "") -> dict[str, str]:
    """An email's variables: the template variables (campaigns.variables) and its unsubscribe link."""
    return {**customer_variables(customer, store_name=store_name), "unsubscribe_url": unsubscribe_url}
