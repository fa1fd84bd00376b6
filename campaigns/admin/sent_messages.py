"""The sent messages' admin lists (WhatsApp, email) and the campaign metrics."""

from __future__ import annotations

import re

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import (
    HttpRequest,
)
from django.utils.translation import gettext_lazy as _

from campaigns import caps
from campaigns.admin.big_tables import BigTableAdmin, CampaignFilter, ErrorCodeFilter, message_fields
from campaigns.models import (
    CampaignMetric,
    EmailMessage,
    WhatsappMessage,
)
from crm.admin_columns import short_datetime
from crm.money import format_money

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
    readonly_fields = fields = message_fields(WhatsappMessage)

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
    readonly_fields = fields = message_fields(EmailMessage)

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
