"""The admin index's dashboard for a manager (project.admin_dashboard.organization_home)."""

from __future__ import annotations

from typing import Any

from django import template

from project.admin_dashboard import organization_home as _home

register = template.Library()


@register.simple_tag
def organization_home(user: Any) -> dict[str, Any] | None:
    """{% organization_home request.user as home %}: the dashboard's context, or None."""
    return _home(user)
