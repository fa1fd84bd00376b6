"""{% load money %}{{ amount|money }} or {{ amount|money:"USD" }}: crm.money.format_money."""

from __future__ import annotations

from typing import Any

from django import template

from crm.money import DEFAULT_CURRENCY, format_money

register = template.Library()


@register.filter(name="money")
def money(amount: Any, currency: str = DEFAULT_CURRENCY) -> str:
    return format_money(amount, currency or DEFAULT_CURRENCY)
