"""`{% load money %}{{ amount|brl }}`: crm.money.brl in templates."""

from __future__ import annotations

from django import template

from crm.money import brl as _brl

register = template.Library()
register.filter("brl", _brl, is_safe=True)
