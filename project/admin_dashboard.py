"""The organization dashboard (/admin/crm/organization/<pk>/dashboard/): the last 30 days of an
organization's campaigns, sends per day, NPS and paused sending. Mounted on the organization's
admin through `crm.admin.register_organization_page` (imported by ProjectConfig.ready), and the
admin's home page for a member of one organization (`organization_home`, through the index
template's `organization_home` tag)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _

from crm import tenancy
from crm.admin import OrganizationAdmin, register_organization_page
from crm.models import Organization
from project import dashboards


@register_organization_page("dashboard/", name="crm_organization_dashboard")
def organization_dashboard_view(
    model_admin: OrganizationAdmin, request: HttpRequest, organization: Organization
) -> TemplateResponse:
    """The organization's last 30 days: campaigns, sends per day, NPS, paused sending."""
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        **board_context(organization),
    }
    return TemplateResponse(request, "admin/crm/organization/dashboard.html", context)


def board_context(organization: Organization) -> dict[str, Any]:
    """What the dashboard's template (admin/crm/organization/_board.html) reads."""
    board = dashboards.organization_dashboard(organization=organization)
    return {
        "title": _("%(organization)s: last %(days)d days")
        % {"organization": organization.name, "days": dashboards.DASHBOARD_DAYS},
        "original": organization,
        "board": board,
        "max_campaigns": dashboards.DASHBOARD_MAX_CAMPAIGNS,
        "chart": {
            "time_zone": organization.timezone,
            "days": [row["day"].isoformat() for row in board.days],
            "whatsapp_sent": [row["whatsapp_sent"] for row in board.days],
            "email_sent": [row["email_sent"] for row in board.days],
            "labels": {
                "day": str(_("day")),
                "whatsapp_sent": str(_("WhatsApp sent")),
                "email_sent": str(_("emails sent")),
            },
        },
    }


def organization_home(user: Any) -> dict[str, Any] | None:
    """The admin index's dashboard for a member of exactly one organization (the manager's home
    page), None for anyone else (platform operators keep the apps and the operations)."""
    ids = tenancy.organization_ids(user)
    if ids is None or len(ids) != 1:
        return None
    organization = Organization.objects.filter(pk=next(iter(ids))).first()
    return board_context(organization) if organization is not None else None
