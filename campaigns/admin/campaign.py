"""The campaign's admin: its list, form, fieldsets and bulk actions."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
)
from django.utils.translation import gettext_lazy as _

from campaigns import lifecycle, recurring
from campaigns.admin.campaign_display import CampaignDisplay
from campaigns.admin.campaign_views import CampaignViews, _act
from campaigns.composer import CampaignForm
from campaigns.models import (
    CONTENT_FIELDS,
    Campaign,
    Channel,
)
from crm import tenancy
from crm.admin_columns import short_datetime
from crm.tenancy import TenantAdmin


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
class CampaignAdmin(CampaignViews, CampaignDisplay, TenantAdmin):
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
        kept = [fs for fs in fieldsets if other not in fs[1].get("classes", ())]
        if not obj.content_locked:
            return kept
        # Sent content is shown read-only: no template picker offering another one.
        return [
            (name, {**options, "fields": tuple(f for f in options["fields"] if f != "whatsapp_template")})
            for name, options in kept
        ]

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
        return not lifecycle.campaign_has_messages(campaign=obj)

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: dict | None = None) -> Any:
        """A manager who asks to delete a campaign with messages is refused with why and what to do
        (archive it), not the generic "ask your organization's manager"."""
        campaign = self.get_object(request, unquote(object_id))
        if (
            campaign is not None
            and super().has_delete_permission(request, campaign)
            and not self.has_delete_permission(request, campaign)
        ):
            raise PermissionDenied(
                _("Campaigns with messages are archived, not deleted: %(names)s") % {"names": campaign}
            )
        return super().delete_view(request, object_id, extra_context)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        """The list's bulk delete deletes only campaigns without messages (unless by an operator)."""
        if not tenancy.is_operator(request.user):
            kept = [c for c in queryset if lifecycle.campaign_has_messages(campaign=c)]
            if kept:
                messages.error(
                    request,
                    _("Campaigns with messages are archived, not deleted: %(names)s")
                    % {"names": ", ".join(str(c) for c in kept)},
                )
                queryset = queryset.exclude(pk__in=[c.pk for c in kept])
        super().delete_queryset(request, queryset)

    @admin.action(description=_("Start (send now)"), permissions=["change"])
    def start(self, request, queryset):
        _act(request, queryset, lifecycle.campaign_start, _("started"))

    @admin.action(description=_("Cancel"), permissions=["change"])
    def cancel(self, request, queryset):
        _act(request, queryset, lifecycle.campaign_cancel, _("cancelled"))

    @admin.action(description=_("Pause"), permissions=["change"])
    def pause(self, request, queryset):
        _act(request, queryset, lifecycle.campaign_pause, _("paused"))

    @admin.action(description=_("Resume"), permissions=["change"])
    def resume(self, request, queryset):
        _act(request, queryset, lifecycle.campaign_resume, _("resumed"))

    @admin.action(description=_("Retry failed messages"), permissions=["change"])
    def retry_failed(self, request, queryset):
        _act(request, queryset, lifecycle.campaign_retry_failed, _("failed messages queued again"))

    @admin.action(description=_("Activate recurrence"), permissions=["change"])
    def recurrence_activate(self, request, queryset):
        _act(request, queryset, recurring.campaign_recurrence_activate, _("recurring"))

    @admin.action(description=_("Stop recurrence"), permissions=["change"])
    def recurrence_stop(self, request, queryset):
        _act(request, queryset, recurring.campaign_recurrence_stop, _("recurrence stopped"))

    @admin.action(
        description=_("Archive (hide from the list; messages and sales stay)"), permissions=["change"]
    )
    def archive(self, request, queryset):
        _act(request, queryset, lifecycle.campaign_archive, _("archived"))

    @admin.action(description=_("Unarchive"), permissions=["change"])
    def unarchive(self, request, queryset):
        _act(request, queryset, lifecycle.campaign_unarchive, _("unarchived"))
