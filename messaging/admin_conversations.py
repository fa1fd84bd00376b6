"""The conversations in the admin: every message (filter "waiting for Chatwoot" shows what waits),
the organization's words and texts, the customer's conversation with a reply box, a media download."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import content_disposition_header
from django.utils.translation import gettext_lazy as _

from crm import tenancy
from crm.models import Customer
from crm.tenancy import TenantAdmin
from integrations.errors import IntegrationError
from integrations.whatsapp.media import media_fetch
from messaging import chatwoot_inbound, chatwoot_replies, conversations
from messaging.models import ConversationMessage, ConversationSettings

ROWS = 50


class WaitingForChatwoot(admin.SimpleListFilter):
    title = _("Chatwoot")
    parameter_name = "chatwoot"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("waiting", _("waiting for Chatwoot"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(chatwoot_pending=True) if self.value() == "waiting" else queryset


class ReplyForm(forms.Form):
    text = forms.CharField(label=_("Reply"), widget=forms.Textarea(attrs={"rows": 3}), max_length=4096)


@admin.register(ConversationMessage)
class ConversationMessageAdmin(TenantAdmin):
    list_display = (
        "at",
        "direction",
        "customer",
        "kind",
        "text",
        "status",
        "source",
        "campaign_id",
        "chatwoot",
    )
    list_select_related = ("customer",)
    list_filter = (WaitingForChatwoot, "direction", "kind", "status", "source")
    search_fields = ("=wamid",)
    raw_id_fields = ("customer", "whatsapp_number", "store", "sent_by")
    show_full_result_count = False
    ordering = ("-id",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("Chatwoot"))
    def chatwoot(self, obj: ConversationMessage) -> str:
        if obj.chatwoot_pending:
            return format_html('<span title="{}">{}</span>', obj.chatwoot_error, _("waiting"))
        return "✓" if obj.chatwoot_message_id else "—"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        visible = tenancy.organization_ids(request.user)

        def count(campaign: bool | None = None) -> int:
            waiting = chatwoot_inbound.waiting(campaign=campaign)
            return sum(n for org, n in waiting.items() if visible is None or org in visible)

        extra_context = {
            **(extra_context or {}),
            "title": _(
                "Conversation messages (%(n)s waiting for Chatwoot, %(campaign)s of them campaign messages)"
            )
            % {"n": count(), "campaign": count(campaign=True)},
        }
        return super().changelist_view(request, extra_context)

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "customer/<int:pk>/",
                self.admin_site.admin_view(self.conversation_view),
                name="messaging_conversation",
            ),
            path(
                "<int:pk>/media/",
                self.admin_site.admin_view(self.media_view),
                name="messaging_conversation_media",
            ),
            *super().get_urls(),
        ]

    def conversation_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """The customer's conversation, and (managers, inside the window) a reply from the same number."""
        customer = tenancy.scope(Customer.objects.all(), request.user, "organization").filter(pk=pk).first()
        if customer is None:
            raise Http404
        number = conversations.reply_number(customer.pk)
        until = conversations.window_until(customer_id=customer.pk, number_id=number.pk) if number else None
        form = ReplyForm(request.POST or None)
        if request.method == "POST":
            if not tenancy.may_manage(request.user, customer.organization_id):
                raise PermissionDenied
            if form.is_valid():
                sent = conversations.reply_queue(
                    customer=customer,
                    text=form.cleaned_data["text"],
                    source="manager",
                    sent_by_id=request.user.pk,
                )
                if sent.status == ConversationMessage.Status.REFUSED:
                    messages.error(request, sent.error)
                else:
                    messages.success(request, _("Reply queued: it goes out in a moment."))
                return redirect(request.path)
        rows = list(ConversationMessage.objects.filter(customer=customer).order_by("-at", "-id")[:ROWS])
        context = {
            **self.admin_site.each_context(request),
            "title": _("Conversation with %(customer)s") % {"customer": customer},
            "customer": customer,
            "rows": rows[::-1],
            "number": number,
            "window_until": until,
            "form": form,
            "may_reply": until is not None and tenancy.may_manage(request.user, customer.organization_id),
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/messaging/conversation.html", context)

    def media_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """The message's media, fetched from Meta now (through the outbound guard), never stored;
        what cannot be fetched sends back to the conversation saying why."""
        row = (
            self.scoped(request, ConversationMessage.objects.select_related("whatsapp_number"))
            .filter(pk=pk)
            .first()
        )
        if row is None:
            raise Http404
        back = redirect("admin:messaging_conversation", pk=row.customer_id)
        number = row.whatsapp_number
        if not row.media_id or number is None:
            messages.error(request, _("This message has no media."))
            return back
        try:
            media = media_fetch(
                base_url=number.graph_url or settings.WHATSAPP_GRAPH_URL,
                version=settings.WHATSAPP_GRAPH_VERSION,
                media_id=row.media_id,
                access_token=number.get_access_token(),
            )
        except IntegrationError as exc:
            messages.error(request, _("Meta did not give the media: %(error)s") % {"error": exc})
            return back
        return media_response(media.content, media.mime_type, row.media_filename or row.media_id)


# What a browser may show in place: pictures, sound and video. Anything else a customer sends (an
# HTML or SVG "document" would run its script on the admin's origin, in the manager's session) is
# a download.
INLINE_TYPES = frozenset({"image/jpeg", "image/png", "image/webp", "image/gif"})
INLINE_PREFIXES = ("audio/", "video/")
_UNSAFE_FILENAME = re.compile(r"[\x00-\x1f\x7f/\\]")


def media_response(content: bytes, mime_type: str, filename: str) -> HttpResponse:
    """A customer's media as the admin serves it: shown in place only when it is a picture, sound
    or video, else downloaded; never sniffed, never scripted (a sandbox policy), its file name (the
    customer's) quoted safely."""
    kind = mime_type.split(";", 1)[0].strip().lower()
    inline = kind in INLINE_TYPES or kind.startswith(INLINE_PREFIXES)
    response = HttpResponse(content, content_type=kind or "application/octet-stream")
    name = _UNSAFE_FILENAME.sub("_", filename)[:255] or "media"
    response["Content-Disposition"] = content_disposition_header(not inline, name) or "attachment"
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox"
    return response


@admin.register(ConversationSettings)
class ConversationSettingsAdmin(TenantAdmin):
    list_display = ("organization", "opt_out_keywords", "resume_keywords", "chatwoot_webhook")
    list_select_related = ("organization",)
    readonly_fields = ("chatwoot_webhook",)

    @admin.display(description=_("Chatwoot webhook URL (message_created)"))
    def chatwoot_webhook(self, obj: ConversationSettings) -> str:
        if not obj.organization_id:
            return "—"
        return reverse("chatwoot-webhook", args=[chatwoot_replies.webhook_token(obj.organization_id)])
