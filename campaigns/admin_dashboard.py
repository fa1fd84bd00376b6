"""The organization dashboard (/admin/crm/organization/<pk>/dashboard/): the last 30 days of an
organization's campaigns, sends per day, NPS and paused sending. Mounted on the organization's
admin through `crm.admin.register_organization_page` (imported by CampaignsConfig.ready)."""

from __future__ import annotations

from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _

from campaigns import dashboards
from crm.admin import OrganizationAdmin, register_organization_page
from crm.models import Organization


@register_organization_page("dashboard/", name="crm_organization_dashboard")
def organization_dashboard_view(
    model_admin: OrganizationAdmin, request: HttpRequest, organization: Organization
) -> TemplateResponse:
    """The organization's last 30 days: campaigns, sends per day, NPS, paused sending."""
    board = dashboards.organization_dashboard(organization=organization)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("%(organization)s: last %(days)d days")
        % {"organization": organization.name, "days": dashboards.DASHBOARD_DAYS},
        "opts": model_admin.model._meta,
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
    return TemplateResponse(request, "admin/crm/organization/dashboard.html", context)
