"""The campaign admin's own pages: live status, test send, audience count, lifecycle verbs, series."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy as _

from campaigns import audience, composer, dashboards, lifecycle, selectors
from campaigns.admin.campaign_display import audience_html, preview_cost
from campaigns.models import (
    Campaign,
)
from campaigns.test_sends import test_send_context, test_send_post
from crm import tenancy
from crm.cli import number
from crm.models import Organization
from crm.tenancy import TenantAdmin

# The campaign page's buttons: verb -> (label, service, what the message says when done).
LIFECYCLE: dict[str, tuple[Any, Any, Any]] = {
    "start": (_("Start"), lifecycle.campaign_start, _("started")),
    "pause": (_("Pause"), lifecycle.campaign_pause, _("paused")),
    "resume": (_("Resume"), lifecycle.campaign_resume, _("resumed")),
    "cancel": (_("Cancel"), lifecycle.campaign_cancel, _("cancelled")),
}
_VERBS_BY_STATUS = {
    Campaign.Status.DRAFT: ("start", "cancel"),
    Campaign.Status.SCHEDULED: ("start", "cancel"),
    Campaign.Status.SENDING: ("pause", "cancel"),
    Campaign.Status.PAUSED: ("resume", "cancel"),
}


def lifecycle_verbs(campaign: Campaign) -> tuple[str, ...]:
    """The buttons the campaign's page shows in its current status."""
    if campaign.archived_at is not None:
        return ()
    return _VERBS_BY_STATUS.get(Campaign.Status(campaign.status), ())


def lifecycle_summary(campaign: Campaign, verb: str) -> dict[str, Any]:
    """What the confirmation repeats: before a start, the audience and its estimated cost (and why
    it cannot start); after, what is left to send and the cost so far."""
    if verb == "start":
        preview = audience.audience_preview(campaign=campaign)
        return {
            "receives": number(preview.receives),
            "cost": preview_cost(preview, campaign),
            "problem": preview.problem,
            "audience": audience_html(preview, campaign),
        }
    status = selectors.campaign_status(campaign=campaign)
    left = status["counts"]["queued"] + status["counts"]["sending"]
    return {"receives": number(left), "cost": status["cost_display"], "problem": "", "audience": ""}


def _act(request: HttpRequest, queryset: QuerySet[Campaign], fn, done: str) -> None:
    for campaign in queryset:
        try:
            fn(campaign=campaign)
        except lifecycle.CampaignError as exc:
            messages.error(request, f"{campaign}: {exc}")
        else:
            messages.success(request, f"{campaign}: {done}")


class CampaignViews(TenantAdmin):
    """CampaignAdmin's URLs and views, and the change form around them."""

    def get_urls(self):

        return [
            path(
                "<int:pk>/status/",
                self.admin_site.admin_view(self.status_view),
                name="campaigns_campaign_status",
            ),
            path(
                "<int:pk>/test-send/",
                self.admin_site.admin_view(self.test_send_view),
                name="campaigns_campaign_test_send",
            ),
            *(
                path(
                    f"<int:pk>/{verb}/",
                    self.admin_site.admin_view(self.lifecycle_view),
                    {"verb": verb},
                    name=f"campaigns_campaign_{verb}",
                )
                for verb in LIFECYCLE
            ),
            path(
                "audience-count/",
                self.admin_site.admin_view(self.audience_count_view),
                name="campaigns_campaign_audience_count",
            ),
            path(
                "<int:pk>/series/",
                self.admin_site.admin_view(self.series_view),
                name="campaigns_campaign_series",
            ),
            *super().get_urls(),
        ]

    def status_view(self, request: HttpRequest, pk: int) -> JsonResponse:
        """The live progress as JSON (polled by the change page)."""
        campaign = self.scoped(request, Campaign.objects.all()).filter(pk=pk).first()
        if campaign is None or not self.has_view_permission(request, campaign):
            return JsonResponse({"error": "not found"}, status=404)
        return JsonResponse(selectors.campaign_status(campaign=campaign))

    def test_send_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """POST: send this campaign to the manager's phone with a chosen customer's variables."""
        campaign = self.scoped(request, Campaign.objects.all()).filter(pk=pk).first()
        if campaign is None or not self.has_view_permission(request, campaign):
            raise Http404
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request, campaign):
            raise PermissionDenied
        return test_send_post(request, campaign)

    def audience_count_view(self, request: HttpRequest) -> JsonResponse:
        """The form's audience as it is being edited (GET: the form's audience fields): who its
        filters select and who of them may receive it — the live count (aggregates only; the
        contact caps are counted on the saved campaign's page)."""
        org_id = request.GET.get("organization", "")
        if not org_id:
            return JsonResponse({})  # no organization chosen yet: nothing to count
        org = (
            tenancy.scope(Organization.objects.all(), request.user, "pk").filter(pk=int(org_id)).first()
            if org_id.isdigit() and len(org_id) < 19
            else None
        )
        if org is None or not self.has_view_permission(request):
            return JsonResponse({"error": "not found"}, status=404)
        form = composer.AudienceCountForm(request.GET, organization=org)
        if not form.is_valid():
            return JsonResponse({"error": form.errors.get_json_data()}, status=400)
        counts = selectors.campaign_audience_counts(campaign=form.campaign())
        return JsonResponse(
            {
                **counts,
                "receives_display": number(counts["receives"]),
                "selected_display": number(counts["selected"]),
            }
        )

    def lifecycle_view(self, request: HttpRequest, pk: int, verb: str) -> HttpResponse:
        """GET: the confirmation of start, pause, resume or cancel, repeating the audience's size
        and cost (or what is left to send); POST: do it through the service, back to the page."""
        campaign = self.scoped(request, Campaign.objects.select_related("organization")).filter(pk=pk).first()
        if campaign is None or verb not in LIFECYCLE or not self.has_view_permission(request, campaign):
            raise Http404
        label, service, done = LIFECYCLE[verb]
        if request.method == "POST":
            if not self.has_change_permission(request, campaign):
                raise PermissionDenied
            _act(request, Campaign.objects.filter(pk=campaign.pk), service, str(done))
            return HttpResponseRedirect(reverse("admin:campaigns_campaign_change", args=[campaign.pk]))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "original": campaign,
            "title": _("%(action)s: %(campaign)s") % {"action": label, "campaign": campaign},
            "verb": verb,
            "label": label,
            "may_change": self.has_change_permission(request, campaign),
            **lifecycle_summary(campaign, verb),
        }
        return TemplateResponse(request, "admin/campaigns/campaign/lifecycle_confirm.html", context)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["live_count_label"] = _(
            "Live count: %(receives)s may receive it (%(selected)s selected by the filters)."
        )
        if obj is not None and obj.pk:
            context["lifecycle"] = [
                (verb, LIFECYCLE[verb][0])
                for verb in lifecycle_verbs(obj)
                if self.has_change_permission(request, obj)
            ]
        if obj is not None and obj.pk:
            context["test_send"] = test_send_context(obj)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def series_view(self, request: HttpRequest, pk: int) -> JsonResponse:
        """Messages per time bucket and status and the cumulative cost as JSON (the change page's charts)."""
        campaign = self.scoped(request, Campaign.objects.select_related("organization")).filter(pk=pk).first()
        if campaign is None or not self.has_view_permission(request, campaign):
            return JsonResponse({"error": "not found"}, status=404)
        return JsonResponse(dashboards.campaign_series_cached(campaign=campaign))

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        """Times on the form (the schedule) are read and shown in the organization's time zone."""
        org_id = request.POST.get("organization") if request.method == "POST" else None
        if not org_id and str(object_id or "").isdigit():
            visible = self.scoped(request, Campaign.objects.filter(pk=object_id))
            org_id = visible.values_list("organization_id", flat=True).first()
        # Only an organization the user may write into: a posted id of another names nothing of it.
        zone = (
            tenancy.scope(Organization.objects.filter(pk=org_id), request.user, "pk", managed=True)
            .values_list("timezone", flat=True)
            .first()
            if str(org_id or "").isdigit()
            else None
        )
        if not zone:
            return super().changeform_view(request, object_id, form_url, extra_context)
        with dj_timezone.override(zone):
            extra_context = {**(extra_context or {}), "organization_time_zone": zone}
            response = super().changeform_view(request, object_id, form_url, extra_context)
            if hasattr(response, "render"):
                response.render()  # inside the zone: the rendered times are the organization's
            return response

    def save_model(self, request: HttpRequest, obj: Campaign, form, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if "scheduled_at" not in form.changed_data:
            return
        try:
            if obj.scheduled_at:
                lifecycle.campaign_schedule(campaign=obj, at=obj.scheduled_at)
                messages.info(request, _("Scheduled for %(at)s.") % {"at": obj.scheduled_at})
            elif obj.status == Campaign.Status.SCHEDULED:
                lifecycle.campaign_unschedule(campaign=obj)
                messages.info(request, _("Unscheduled: back to draft."))
        except lifecycle.CampaignError as exc:
            messages.error(request, str(exc))
