from __future__ import annotations

import re
from datetime import date
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db import connections, models
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone as dj_timezone
from django.utils.formats import date_format, number_format
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from campaigns import audience, caps, composer, lift_pages, segments, selectors, services
from campaigns.composer import CampaignForm
from campaigns.models import (
    CONTENT_FIELDS,
    Campaign,
    CampaignMetric,
    Channel,
    CustomerSegment,
    EmailMessage,
    SegmentMovement,
    WhatsappMessage,
)
from crm import tenancy
from crm.admin_columns import short_datetime
from crm.admin_lists import CheckedChangeList
from crm.cli import number
from crm.models import Organization
from crm.money import format_cost, format_money
from crm.tenancy import TenantAdmin
from integrations.whatsapp import errors as whatsapp_errors

# Labels of every key in campaign_status()["counts"], both channels.
COUNT_LABELS = {
    **dict(WhatsappMessage.Status.choices),
    **dict(EmailMessage.Status.choices),
    "opened": _("opened"),
    "clicked": _("clicked"),
}


def now_labels(channel: str) -> dict[str, Any]:
    """Labels of the campaign page's "Now" counts: each message in exactly one current state, so a
    WhatsApp "sent" there is sent and not yet delivered (the organization page counts cumulatively)."""
    labels = dict(COUNT_LABELS)
    if channel == Channel.WHATSAPP:
        labels.update(sent=_("sent (not yet delivered)"), delivered=_("delivered (not read)"), read=_("read"))
    return labels


def _per_cost(figures: selectors.CampaignAttribution) -> str:
    """Revenue ÷ cost when both are in reais, else through the organization's conversion rate,
    labelled an estimate; "—" when neither (two currencies are never divided as if one)."""
    if figures.revenue_per_cost is not None:
        return number(figures.revenue_per_cost, 2)
    if figures.revenue_per_cost_estimate is not None:
        return str(_("%(ratio)s (estimate)") % {"ratio": number(figures.revenue_per_cost_estimate, 2)})
    return "—"


def preview_cost(preview: audience.AudiencePreview, campaign: Campaign) -> str:
    """The preview's estimated cost in its currency (and in reais at the organization's rate)."""
    if preview.cost is None:
        return str(_("no per-message price"))
    org = campaign.organization
    return format_cost(
        preview.cost,
        preview.currency,
        rate=org.cost_conversion_rate,
        rate_currency=org.cost_conversion_currency,
    )


def audience_html(preview: audience.AudiencePreview, campaign: Campaign) -> str:
    """The audience preview as the campaign page shows it."""
    rows = format_html_join(
        "",
        '<tr><th>{}</th><td data-skip="{}">{}</td></tr>',
        ((audience.SKIP_LABELS[key], key, number(n)) for key, n in preview.skipped.items()),
    )
    problem = format_html(
        '<p class="errornote" id="audience-problem">{} {}</p>', _("It cannot start:"), preview.problem
    )
    return format_html(
        '<div id="audience-preview"><p><strong data-field="receives">{}</strong> {} · {} '
        '<strong data-field="estimated-cost">{}</strong></p>{}'
        '<table id="audience-skips"><caption>{}</caption>{}</table></div>',
        number(preview.receives),
        _("will receive it"),
        _("estimated cost:"),
        preview_cost(preview, campaign),
        problem if preview.problem else "",
        _("Skipped, by reason"),
        rows,
    )


# The campaign page's buttons: verb -> (label, service, what the message says when done).
LIFECYCLE: dict[str, tuple[Any, Any, Any]] = {
    "start": (_("Start"), services.campaign_start, _("started")),
    "pause": (_("Pause"), services.campaign_pause, _("paused")),
    "resume": (_("Resume"), services.campaign_resume, _("resumed")),
    "cancel": (_("Cancel"), services.campaign_cancel, _("cancelled")),
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
        except services.CampaignError as exc:
            messages.error(request, f"{campaign}: {exc}")
        else:
            messages.success(request, f"{campaign}: {done}")


class ArchivedFilter(admin.SimpleListFilter):
    """Archived campaigns are hidden unless asked for: the default list shows the others."""

    title = _("archived")
    parameter_name = "archived"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Archived")), ("all", _("All campaigns"))]

    def choices(self, changelist: Any) -> Any:
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": _("Not archived"),
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(archived_at__isnull=False)
        if self.value() == "all":
            return queryset
        return queryset.filter(archived_at__isnull=True)


@admin.register(Campaign)
class CampaignAdmin(TenantAdmin):
    form = CampaignForm
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    # "ID": the number the management commands take (campaign_send 12, campaign_status 12…).
    list_display = (
        "id",
        "name",
        "organization",
        "channel",
        "status",
        "progress",
        short_datetime("started_at", _("started at")),
        short_datetime("finished_at", _("finished at")),
    )
    list_display_links = ("id", "name")
    list_select_related = ("organization", "metric")
    list_filter = (ArchivedFilter, "status", "channel", "organization")
    search_fields = ("name", "template_name")
    raw_id_fields = ("audience_store",)
    readonly_fields = (
        "status",
        "started_at",
        "finished_at",
        "stop_reason",
        "live_status",
        "attribution",
        "incrementality",
        "replies",
        "charts",
        "preview",
        "recurrence_until",
        "recurrence_next",
        "parent",
        "occurrence_at",
        "archived_at",
        "audience_counts",
    )
    change_form_template = "admin/campaigns/campaign/change_form.html"
    actions = [
        "start",
        "cancel",
        "pause",
        "resume",
        "retry_failed",
        "recurrence_activate",
        "recurrence_stop",
        "archive",
        "unarchive",
    ]
    fieldsets = (
        (None, {"fields": ("organization", "name", "channel", "status", "stop_reason", "archived_at")}),
        (
            _("WhatsApp template"),
            {
                "fields": (
                    "whatsapp_number",
                    "sender",
                    "whatsapp_template",
                    "template_name",
                    "template_language",
                    "template_category",
                    "template_variables",
                    "header_image_url",
                    ("redirect_url", "redirect_button_index"),
                    "unsubscribe_button_index",
                ),
                "classes": ("channel-whatsapp",),
            },
        ),
        (
            _("Email"),
            {
                "fields": ("email_subject", "email_body_format", "email_body"),
                "classes": ("channel-email",),
                "description": _(
                    "For email campaigns. The body is MJML (https://mjml.io) or HTML; links are "
                    "click-tracked and an open pixel is added. Save, then see the preview below."
                ),
            },
        ),
        (
            _("Audience"),
            {
                "fields": (
                    "audience_store",
                    "audience_purchased_within_days",
                    "audience_segment",
                    ("audience_last_purchase_from", "audience_last_purchase_to"),
                    ("audience_purchases_min", "audience_purchases_max"),
                    ("audience_spent_min", "audience_spent_max"),
                    "audience_birthday_month",
                    "control_percent",
                    "audience_counts",
                )
            },
        ),
        (
            _("Schedule"),
            {
                "fields": ("scheduled_at",),
                "description": _(
                    "Set a time and save to schedule the start (in the organization's "
                    "time zone); clear it to unschedule. Or use the action 'Start (send "
                    "now)' in the list."
                ),
            },
        ),
        (
            _("Recurrence"),
            {
                "fields": (
                    "recurrence",
                    "recurrence_next",
                    "recurrence_misfire",
                    "recurrence_until",
                    ("parent", "occurrence_at"),
                ),
                "description": _(
                    "A recurring campaign sends a copy of itself at each occurrence of its cron "
                    "expression (organization's time zone), checked every 5 minutes. Use the actions "
                    "'Activate recurrence' / 'Stop recurrence'."
                ),
            },
        ),
        (
            _("Progress"),
            {
                "fields": (
                    "started_at",
                    "finished_at",
                    "live_status",
                    "attribution",
                    "incrementality",
                    "replies",
                    "charts",
                    "preview",
                )
            },
        ),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Campaign | None = None) -> Any:
        """A saved campaign shows its own channel's section only (the add form shows both, and a
        small script in the template hides the one the chosen channel does not use)."""
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not obj.pk:
            return fieldsets
        other = "channel-whatsapp" if obj.channel == Channel.EMAIL else "channel-email"
        return [fs for fs in fieldsets if other not in fs[1].get("classes", ())]

    def get_readonly_fields(self, request: HttpRequest, obj: Campaign | None = None) -> Any:
        """What a started campaign sent is history: its content is shown, never edited (the model
        refuses the change on any other path too)."""
        fields = tuple(super().get_readonly_fields(request, obj))
        if obj is not None and obj.pk and obj.content_locked:
            fields += tuple(f for f in CONTENT_FIELDS if f not in fields)
        return fields

    def has_delete_permission(self, request: HttpRequest, obj: Campaign | None = None) -> bool:
        """A campaign with messages is history: a manager archives it, never deletes it (its messages
        and credited sales stay). Platform operators keep the delete."""
        if not super().has_delete_permission(request, obj):
            return False
        if obj is None or tenancy.is_operator(request.user):
            return True
        return not services.campaign_has_messages(campaign=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        """The list's bulk delete deletes only campaigns without messages (unless by an operator)."""
        if not tenancy.is_operator(request.user):
            kept = [c for c in queryset if services.campaign_has_messages(campaign=c)]
            if kept:
                messages.error(
                    request,
                    _("Campaigns with messages are archived, not deleted: %(names)s")
                    % {"names": ", ".join(str(c) for c in kept)},
                )
                queryset = queryset.exclude(pk__in=[c.pk for c in kept])
        super().delete_queryset(request, queryset)

    def get_urls(self):
        from django.urls import path

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
        from campaigns.test_sends import test_send_post

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
        return JsonResponse({**counts, "receives_display": number(counts["receives"])})

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
            from campaigns.test_sends import test_send_context

            context["test_send"] = test_send_context(obj)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def series_view(self, request: HttpRequest, pk: int) -> JsonResponse:
        """Messages per time bucket and status and the cumulative cost as JSON (the change page's charts)."""
        from campaigns import dashboards

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
                services.campaign_schedule(campaign=obj, at=obj.scheduled_at)
                messages.info(request, _("Scheduled for %(at)s.") % {"at": obj.scheduled_at})
            elif obj.status == Campaign.Status.SCHEDULED:
                services.campaign_unschedule(campaign=obj)
                messages.info(request, _("Unscheduled: back to draft."))
        except services.CampaignError as exc:
            messages.error(request, str(exc))

    @admin.display(description=_("progress"))
    def progress(self, obj: Campaign) -> str:
        """Processed (every message settled, sent or not) and sent apart: a campaign that skipped
        everyone reads "4/4 processed · 0 sent", never "100%" alone."""
        metric = getattr(obj, "metric", None)
        if metric is None or not metric.queued:
            return "—"
        done = metric.sent + metric.bounced + metric.blocked + metric.failed + metric.unknown + metric.skipped
        return _("%(done)s/%(total)s processed (%(percent)s%%) · %(sent)s sent") % {
            "done": number_format(done, force_grouping=True),
            "total": number_format(metric.queued, force_grouping=True),
            "percent": 100 * done // metric.queued,
            "sent": number_format(metric.sent, force_grouping=True),
        }

    @admin.display(description=_("live status"))
    def live_status(self, obj: Campaign) -> str:
        if not obj.pk:
            return "—"
        data = selectors.campaign_status(campaign=obj)
        labels = now_labels(obj.channel)
        engagement = [k for k in selectors.ENGAGEMENT_KEYS if k in data["counts"]]
        now_rows = format_html_join(
            "",
            '<tr><th>{}</th><td data-count="{}">{}</td></tr>',
            ((labels.get(k, k), k, number(v)) for k, v in data["counts"].items() if k not in engagement),
        )
        engagement_rows = format_html_join(
            "",
            '<tr><th>{}</th><td data-count="{}">{}</td></tr>',
            ((COUNT_LABELS[k], k, number(data["counts"][k])) for k in engagement),
        )
        return format_html(
            '<div id="live-status" data-url="{}">'
            '<p class="errornote" data-field="sending_paused"{}>{} <span>{}</span></p>'
            '<progress max="1" value="{}"></progress> '
            '{} <span data-field="progress">{}%</span> (<span data-field="processed">{}</span>/'
            '<span data-field="total">{}</span>) · {} <span data-field="reached">{}</span> · '
            '<span data-field="status">{}</span>'
            '<table id="live-now"><caption>{}</caption>{}</table>'
            '<table id="live-reached"><caption>{}</caption>{}'
            '<tr><th>{}</th><td data-field="cost">{}</td></tr>'
            '<tr><th>{}</th><td><span data-field="rate">{}</span>/s</td></tr>'
            '<tr><th>{}</th><td data-field="eta_seconds">{}</td></tr></table></div>',
            "../status/",
            "" if data["sending_paused"] else mark_safe(" hidden"),
            _(
                "Sending is paused (fix the cause, then resume it on the organization's page or, for a "
                "WhatsApp number, with the WhatsApp numbers' action 'Resume sending'):"
            ),
            data["sending_paused"],
            data["progress"],
            _("Processed:"),
            number(round(100 * data["progress"], 1), 1),
            number(data["processed"]),
            number(data["total"]),
            _("sent:"),
            number(data["reached"]),
            data["status_label"],
            _("Now: each message once, in its current state"),
            now_rows,
            _("So far (cumulative)"),
            engagement_rows,
            _("cost"),
            data["cost_display"],
            _("rate"),
            number(data["rate"], 2),
            _("ETA"),
            data["eta_seconds"] or "—",
        )

    @admin.display(description=_("audience now"))
    def audience_counts(self, obj: Campaign) -> str:
        """Before the start: who will receive it, who is skipped by reason (no consent first:
        marketing needs a recorded consent) and the estimated cost, by the fan-out's own rules; and
        why it cannot start when nobody would. Once started, the messages' counts tell it."""
        if not obj.pk or obj.content_locked:
            return "—"
        preview = audience.audience_preview(campaign=obj)
        split = preview.receives + preview.skipped.get("control_group", 0)
        return format_html("{}{}", audience_html(preview, obj), lift_pages.detectable(obj, split))

    @admin.display(description=_("incremental (against the control group)"))
    def incrementality(self, obj: Campaign) -> str:
        """Attributed (last touch) and incremental side by side (campaigns.lift)."""
        if not obj.pk:
            return "—"
        return lift_pages.side_by_side(obj, selectors.campaign_attribution(campaign_id=obj.pk))

    @admin.display(description=_("what it sold"))
    def attribution(self, obj: Campaign) -> str:
        """Attributed revenue and sales against the customers reached and the cost (campaigns.attribution)."""
        if not obj.pk:
            return "—"
        figures = selectors.campaign_attribution(campaign_id=obj.pk)
        rate = figures.conversion_rate
        rows = (
            ("revenue", _("revenue"), format_money(figures.revenue)),
            ("conversions", _("conversions (attributed sales)"), number(figures.conversions)),
            ("buyers", _("customers who bought"), number(figures.buyers)),
            (
                "conversion_rate",
                _("conversion rate (customers who bought ÷ reached)"),
                "—" if rate is None else f"{number(100 * rate, 1)}%",
            ),
            ("revenue_per_cost", _("revenue ÷ cost"), _per_cost(figures)),
        )
        return format_html(
            '<table id="campaign-attribution">{}</table><p class="help">{}</p>',
            format_html_join(
                "", '<tr><th>{}</th><td data-field="{}">{}</td></tr>', ((t, k, v) for k, t, v in rows)
            ),
            _(
                "Sales of customers this campaign reached, made within the organization's attribution "
                "window after its message and credited to the last campaign message before them."
            ),
        )

    @admin.display(description=_("replies"))
    def replies(self, obj: Campaign) -> str:
        """Who wrote back (reply rate over the customers reached) and the latest replies."""
        if not obj.pk or obj.started_at is None:
            return "—"
        replied = selectors.campaign_replies(campaign_id=obj.pk)
        reached = getattr(getattr(obj, "metric", None), "sent", 0)
        rate = f"{number(100 * replied / reached, 1)}%" if reached else "—"
        latest = format_html_join(
            "",
            '<tr><td>{}</td><td><a href="{}">{}</a></td><td>{}</td></tr>',
            (
                (
                    date_format(dj_timezone.localtime(m.at), "SHORT_DATETIME_FORMAT"),
                    reverse("admin:crm_customer_change", args=[m.customer_id]),
                    m.customer,
                    m.text or f"[{m.kind}]",
                )
                for m in selectors.campaign_latest_replies(campaign_id=obj.pk)
            ),
        )
        return format_html(
            '<p id="campaign-replies"><span data-field="replies">{}</span> {} · {} '
            '<span data-field="reply_rate">{}</span></p><table>{}</table>',
            number(replied),
            _("customers wrote back"),
            _("reply rate (÷ reached):"),
            rate,
            latest,
        )

    @admin.display(description=_("charts"))
    def charts(self, obj: Campaign) -> str:
        if not obj.pk or obj.started_at is None:
            return "—"
        return format_html(
            '<div id="campaign-charts" data-url="{}" data-time-label="{}">'
            '<h4>{}</h4><div id="campaign-chart-events"></div>'
            '<h4>{}</h4><div id="campaign-chart-cost" data-title="{}"></div></div>',
            "../series/",
            _("time"),
            _("Messages over time"),
            _("Cost over time (cumulative)"),
            _("cost"),
        )

    @admin.display(description=_("next occurrences"))
    def recurrence_next(self, obj: Campaign) -> str:
        """The recurrence's next runs in the organization's time zone, or why it cannot be read."""
        from campaigns.recurrence import describe, next_occurrences, recurrence_error

        if not obj.recurrence:
            return "—"
        problem = recurrence_error(obj.recurrence)
        if problem:
            return problem
        zone = obj.organization.timezone
        runs = next_occurrences(obj.recurrence, zone)
        words = describe(obj.recurrence)
        return format_html(
            '<span id="recurrence-words">{}</span> <span id="recurrence-next">{} ({})</span>',
            f"{capfirst(words)}:" if words else "",
            ", ".join(date_format(r, "DATETIME_FORMAT") for r in runs),
            zone,
        )

    @admin.display(description=_("preview (first recipients)"))
    def preview(self, obj: Campaign) -> str:
        if not obj.pk:
            return "—"
        if obj.channel == Channel.EMAIL:
            return self._email_preview(obj)
        return composer.preview_html(obj, selectors.campaign_audience(campaign=obj).order_by("pk")[:5])

    def _email_preview(self, obj: Campaign) -> str:
        """The email as the first recipient will see it (links not yet tracked), or the compile error."""
        from campaigns.email_sending import compiled_email, variables_for
        from messaging import email_render

        customer = selectors.campaign_audience(campaign=obj).order_by("pk").first()
        if customer is None:
            return str(_("No recipient in the audience."))
        try:
            compiled = compiled_email(obj)
        except email_render.TemplateError as exc:
            return format_html('<p class="errornote">{}</p>', exc)
        store = obj.audience_store.name if obj.audience_store else obj.organization.name
        rendered = email_render.render_email(
            compiled,
            variables=variables_for(customer, store_name=store, unsubscribe_url="#"),
            click_url="",
            open_pixel_url=None,
        )
        return format_html(
            "<p><strong>{}</strong> {} &lt;{}&gt;</p><p><strong>{}</strong> {}</p>"
            '<iframe sandbox srcdoc="{}" style="width:100%;max-width:700px;height:520px;'
            'border:1px solid #ccc;background:#fff"></iframe>',
            _("To:"),
            customer.name,
            customer.email,
            _("Subject:"),
            rendered.subject,
            rendered.html,
        )

    @admin.action(description=_("Start (send now)"), permissions=["change"])
    def start(self, request, queryset):
        _act(request, queryset, services.campaign_start, _("started"))

    @admin.action(description=_("Cancel"), permissions=["change"])
    def cancel(self, request, queryset):
        _act(request, queryset, services.campaign_cancel, _("cancelled"))

    @admin.action(description=_("Pause"), permissions=["change"])
    def pause(self, request, queryset):
        _act(request, queryset, services.campaign_pause, _("paused"))

    @admin.action(description=_("Resume"), permissions=["change"])
    def resume(self, request, queryset):
        _act(request, queryset, services.campaign_resume, _("resumed"))

    @admin.action(description=_("Retry failed messages"), permissions=["change"])
    def retry_failed(self, request, queryset):
        _act(request, queryset, services.campaign_retry_failed, _("failed messages queued again"))

    @admin.action(description=_("Activate recurrence"), permissions=["change"])
    def recurrence_activate(self, request, queryset):
        _act(request, queryset, services.campaign_recurrence_activate, _("recurring"))

    @admin.action(description=_("Stop recurrence"), permissions=["change"])
    def recurrence_stop(self, request, queryset):
        _act(request, queryset, services.campaign_recurrence_stop, _("recurrence stopped"))

    @admin.action(
        description=_("Archive (hide from the list; messages and sales stay)"), permissions=["change"]
    )
    def archive(self, request, queryset):
        _act(request, queryset, services.campaign_archive, _("archived"))

    @admin.action(description=_("Unarchive"), permissions=["change"])
    def unarchive(self, request, queryset):
        _act(request, queryset, services.campaign_unarchive, _("unarchived"))


# PostgreSQL's row count of a table as its planner sees it: the last ANALYZE's rows per page times the
# table's pages now (so rows added since are counted), without reading a single row. -1: never analyzed.
_ESTIMATED_ROWS_SQL = """
    SELECT CASE WHEN c.reltuples < 0 THEN -1
                WHEN c.relpages = 0 THEN c.reltuples
                ELSE c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int)
           END::bigint
    FROM pg_class c WHERE c.oid = to_regclass(%s)
"""


class CappedCountPaginator(Paginator):
    """Never counts a big table: the whole of a table is PostgreSQL's estimate of its rows (when above
    `cap`), a filtered list is counted up to `cap` + 1 rows (paging a day of a million customers, or a
    million messages, reads at most that many)."""

    cap = 10_000

    @cached_property
    def estimate(self) -> int | None:
        """The table's estimated rows if the list is the whole table and holds more than `cap`, else None."""
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return None
        query = rows.query
        if query.where or query.distinct or query.is_sliced or query.combinator or query.group_by is not None:
            return None
        connection = connections[rows.db]
        with connection.cursor() as cursor:
            cursor.execute(_ESTIMATED_ROWS_SQL, [connection.ops.quote_name(rows.model._meta.db_table)])
            row = cursor.fetchone()
        estimate = int(row[0]) if row and row[0] is not None else -1
        return estimate if estimate > self.cap else None

    @cached_property
    def count(self) -> int:
        if self.estimate is not None:
            return self.estimate
        rows = self.object_list
        # Unordered: any index holding the filtered columns can count them (the order is the page's).
        return rows.order_by()[: self.cap + 1].count() if isinstance(rows, QuerySet) else len(rows)

    def page(self, number: int | str) -> Page:
        """The page's rows by their primary keys, chosen in a subquery (one query still). The keys come
        from an index-only scan of the (filter, id) index, the offset included, which the planner picks
        for a bare SELECT id; for the whole rows it may walk the primary key backwards, filtering,
        because it thinks the rows of a big campaign are spread over the table (they are together, often
        far from the end), and an OFFSET would run the list's joins for every row skipped."""
        number = self.validate_number(number)
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return super().page(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        return Page(rows.filter(pk__in=rows.values("pk")[bottom:top]), number, self)

    @property
    def estimated(self) -> bool:
        return self.estimate is not None

    @property
    def capped(self) -> bool:
        return not self.estimated and self.count > self.cap


class BigTableChangeList(CheckedChangeList):
    """The search bar shows no "N results" when N is an estimate or the cap: the paginator says which."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        if getattr(self.paginator, "estimated", False) or getattr(self.paginator, "capped", False):
            self.full_result_count = self.result_count  # search_form shows a count only when they differ


class BigTableAdmin(TenantAdmin):
    """A list over a table of millions of rows: no full COUNT, no sort but the primary key's index, no
    facet counts, no bulk actions (a "select all" would load every row), and foreign keys as raw ids."""

    paginator = CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    ordering = ("-id",)
    sortable_by = ("id",)
    actions = None

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return BigTableChangeList


def message_fields(model: type[models.Model]) -> list[str]:
    """A message's fields as its page shows them (all read-only): whose and where it stands first,
    then the rest as the model declares them (the shared CampaignMessage fields, then the channel's)."""
    lead = ["id", "campaign", "organization", "customer", "status"]
    return [*lead, *(f.name for f in model._meta.fields if f.name not in lead)]


class CampaignFilter(admin.SimpleListFilter):
    """The campaign, any one by id in the URL (?campaign__id__exact=), listing only the newest 20 of the
    list's channel (and the chosen one): never a choice per campaign."""

    title = _("campaign")
    parameter_name = "campaign__id__exact"
    newest = 20

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        channel = Channel.EMAIL if model_admin.model is EmailMessage else Channel.WHATSAPP
        visible = tenancy.scoped_related(model_admin.admin_site, Campaign, request)
        campaigns = list(
            visible.filter(channel=channel).order_by("-pk").values_list("pk", "name")[: self.newest]
        )
        chosen = self.value()
        if chosen and chosen.isdigit() and int(chosen) not in {pk for pk, _name in campaigns}:
            campaigns += visible.filter(pk=int(chosen)).values_list("pk", "name")
        return [(str(pk), f"{name} (#{pk})") for pk, name in campaigns]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        if not value.isdigit():
            raise IncorrectLookupParameters(f"campaign id {value!r}")
        return queryset.filter(campaign_id=int(value))


class ErrorCodeFilter(admin.SimpleListFilter):
    """Meta's error code: the codes the sender knows, any other through the URL (?error_code__exact=).
    Django's default filter would list the codes with a SELECT DISTINCT over every message."""

    title = _("error code")
    parameter_name = "error_code__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        known = sorted(whatsapp_errors.BY_CODE.items())
        return [(str(code), f"{code} · {action.value.replace('_', ' ')}") for code, action in known]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        if not value.isdigit():
            raise IncorrectLookupParameters(f"error code {value!r}")
        return queryset.filter(error_code=int(value))


_PHONE_PUNCTUATION = re.compile(r"[\s().-]")


@admin.register(WhatsappMessage)
class WhatsappMessageAdmin(BigTableAdmin):
    list_display = (
        "id",
        "campaign",
        "customer",
        "phone",
        "status",
        "error_code",
        "reason",
        short_datetime("sent_at", _("sent at")),
        "cost_display",
    )
    list_select_related = ("campaign__metric", "customer")
    list_filter = (CampaignFilter, "status", ErrorCodeFilter)
    search_fields = ("phone", "wamid")  # how they are searched: get_search_results
    search_help_text = _("A phone number or its beginning (+5511…), or a Meta message id (wamid.…).")
    raw_id_fields = ("campaign", "customer", "organization")
    readonly_fields = message_fields(WhatsappMessage)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """The wamid exactly, or the phone by its beginning: both on an index (Django's default would
        compare UPPER() of every row)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        found = Q(wamid=term)
        digits = _PHONE_PUNCTUATION.sub("", term).removeprefix("+")
        if digits.isdigit():  # the index leaves out the empty phone (models.WhatsappMessage)
            found |= Q(phone__startswith=f"+{digits}") & ~Q(phone="")
        return queryset.filter(found), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description=_("reason"))
    def reason(self, obj: WhatsappMessage) -> str:
        """Why it was skipped or failed, in the page's language when it is one of ours."""
        return caps.skip_reason_label(obj.error_reason)

    @admin.display(description=_("cost"), ordering="cost")
    def cost_display(self, obj: WhatsappMessage) -> str:
        # A cost recorded before currencies were kept is in its campaign's total's currency.
        currency = obj.cost_currency or getattr(getattr(obj.campaign, "metric", None), "cost_currency", "USD")
        return format_money(obj.cost, currency, places=4)


@admin.register(EmailMessage)
class EmailMessageAdmin(BigTableAdmin):
    list_display = (
        "id",
        "campaign",
        "customer",
        "email",
        "status",
        "bounce_type",
        "reason",
        short_datetime("sent_at", _("sent at")),
        short_datetime("opened_at", _("opened at")),
        short_datetime("clicked_at", _("clicked at")),
    )
    list_select_related = ("campaign__metric", "customer")
    list_filter = (CampaignFilter, "status", "bounce_type")
    search_fields = ("email", "esp_message_id")  # how they are searched: get_search_results
    search_help_text = _("An address (in any case) or the provider's message id.")
    raw_id_fields = ("campaign", "customer", "organization")
    readonly_fields = message_fields(EmailMessage)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """The provider's id exactly, or the address in any case: both on an index."""
        term = search_term.strip()
        if not term:
            return queryset, False
        # The index leaves out the empty address (models.EmailMessage).
        return queryset.filter(Q(esp_message_id=term) | Q(email__iexact=term) & ~Q(email="")), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description=_("reason"))
    def reason(self, obj: EmailMessage) -> str:
        """Why it was not delivered: the server's bounce, or why it was skipped or failed."""
        return obj.bounce_message or caps.skip_reason_label(obj.error_reason)


@admin.register(CampaignMetric)
class CampaignMetricAdmin(BigTableAdmin):
    list_display = (
        "campaign",
        "queued",
        "sent",
        "delivered",
        "read",
        "bounced",
        "blocked",
        "failed",
        "unknown",
        "skipped",
        "opened",
        "clicked",
        "cost_display",
    )
    list_select_related = ("campaign",)
    raw_id_fields = ("campaign",)
    tenant_path = "campaign__organization"
    readonly_fields = (
        "campaign",
        "queued",
        "sent",
        "delivered",
        "read",
        "failed",
        "skipped",
        "opened",
        "clicked",
        "bounced",
        "blocked",
        "unknown",
        "cost",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # the fan-out creates a campaign's metric; its counters are the send jobs'

    @admin.display(description=_("cost"), ordering="cost")
    def cost_display(self, obj: CampaignMetric) -> str:
        return format_money(obj.cost, obj.cost_currency)


class SegmentDayFilter(admin.SimpleListFilter):
    """The snapshot day: the newest unless another is chosen (never every day at once)."""

    title = _("day")
    parameter_name = "day"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        org = request.GET.get("organization__id__exact", "")
        visible = tenancy.organization_ids(request.user)
        if org.isdigit() and (visible is None or int(org) in visible):
            visible = {int(org)}
        days = segments.segment_days(organization_ids=visible)
        return [(d.isoformat(), date_format(d, "SHORT_DATE_FORMAT")) for d in days]

    def value(self) -> str | None:
        chosen = super().value()
        return chosen or (str(self.lookup_choices[0][0]) if self.lookup_choices else None)

    def choices(self, changelist: Any):
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset.none()
        try:
            return queryset.filter(day=date.fromisoformat(value))
        except ValueError:
            raise IncorrectLookupParameters(f"day {value[:40]!r}") from None


@admin.register(CustomerSegment)
class CustomerSegmentAdmin(TenantAdmin):
    """Read-only: customers per organization, day and segment; the overview has the counts and movement."""

    list_display = (
        "customer",
        "organization",
        "day",
        "segment",
        "recency_days",
        "frequency",
        "monetary",
        "rfm",
    )
    list_select_related = ("customer", "organization")
    list_filter = ("organization", SegmentDayFilter, "segment")
    # The order of the unique index (organization, day, customer), read backwards: a page is an
    # index range scan, never a sort of the day's rows. Column sorting would force one.
    ordering = ("-organization_id", "-day", "-customer_id")
    sortable_by = ()
    show_full_result_count = False
    paginator = CappedCountPaginator
    list_per_page = 100
    actions = None
    change_list_template = "admin/campaigns/customersegment/change_list.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("R F M"))
    def rfm(self, obj: CustomerSegment) -> str:
        if obj.r_score is None:
            return "—"
        return f"{obj.r_score} {obj.f_score} {obj.m_score}"

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "overview/",
                self.admin_site.admin_view(self.overview_view),
                name="campaigns_customersegment_overview",
            ),
            path(
                "snapshot/",
                self.admin_site.admin_view(self.snapshot_view),
                name="campaigns_customersegment_snapshot",
            ),
            *super().get_urls(),
        ]

    def snapshot_view(self, request: HttpRequest) -> HttpResponse:
        """POST: enqueue a snapshot of the chosen organization's last complete day (a manager's)."""
        from campaigns.tasks import segments_snapshot_enqueue

        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        chosen = request.POST.get("organization", "")
        org = (
            tenancy.scope(Organization.objects.all(), request.user, "pk", managed=True)
            .filter(pk=int(chosen))
            .first()
            if chosen.isdigit()
            else None
        )
        if org is None:
            raise PermissionDenied
        day = segments.default_day(org.timezone)
        if segments_snapshot_enqueue(organization_id=org.pk, day=day):
            messages.success(request, _("Segment snapshot of %(day)s enqueued.") % {"day": date_format(day)})
        else:
            messages.info(request, _("The snapshot of %(day)s is already taken.") % {"day": date_format(day)})
        url = reverse("admin:campaigns_customersegment_overview")
        return HttpResponseRedirect(f"{url}?organization={org.pk}")

    def overview_view(self, request: HttpRequest) -> TemplateResponse:
        """Customers per segment on a day and the movement from the snapshot before (three queries)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        # One query: the organizations the user sees, whether each has a snapshot (the ones shown)
        # and may take one (the ones the user manages: the "Take a snapshot now" form).
        visible = (
            tenancy.scope(Organization.objects.all(), request.user, "pk")
            .annotate(snapshots=Exists(SegmentMovement.objects.filter(organization_id=OuterRef("pk"))))
            .order_by("name")
            .values_list("pk", "name", "snapshots")
        )
        managed = tenancy.managed_ids(request.user)
        rows = list(visible)
        organizations = [(pk, name) for pk, name, snapshots in rows if snapshots]
        snapshot_organizations = [(pk, name) for pk, name, _s in rows if managed is None or pk in managed]
        chosen = request.GET.get("organization", "")
        org_id = int(chosen) if chosen.isdigit() else (organizations[0][0] if organizations else None)
        if org_id not in dict(organizations):
            org_id = None
        days = segments.segment_days(organization_id=org_id) if org_id else []
        wanted = request.GET.get("day", "")
        day = next((d for d in days if d.isoformat() == wanted), days[0] if days else None)
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": _("Customer segments"),
            "opts": self.model._meta,
            "organizations": organizations,
            "organization_id": org_id,
            "days": days,
            "day": day,
            "rules": segments.RULES,
            "snapshot_organizations": snapshot_organizations,
        }
        if org_id and day:
            movement = segments.segment_movement(organization_id=org_id, day=day)
            labels = [(str(s.value), s.label) for s in segments.Segment]
            columns = [*labels, ("", _("left the snapshot"))]
            context.update(
                previous_day=movement.previous_day,
                total=sum(movement.counts.values()),
                rows=[
                    {
                        "code": code,
                        "label": label,
                        "count": movement.counts[code],
                        "previous": movement.previous_counts[code],
                        "change": movement.counts[code] - movement.previous_counts[code],
                    }
                    for code, label in labels
                ],
                columns=columns,
                matrix=[
                    {
                        "code": code,
                        "label": label,
                        "cells": [
                            {
                                "to": to,
                                "n": movement.matrix.get((code, to), 0),
                                "stayed": bool(code) and code == to,
                            }
                            for to, _label in columns
                        ],
                    }
                    for code, label in [*labels, ("", _("not in the previous snapshot"))]
                ],
            )
        return TemplateResponse(request, "admin/campaigns/customersegment/overview.html", context)
