"""The campaigns' part of the customer's admin page (crm.customer_page): messages by channel with
their status, and the RFM segment of the latest snapshot."""

from __future__ import annotations

from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from campaigns.caps import skip_reason_label
from campaigns.models import CustomerSegment, EmailMessage, WhatsappMessage
from crm.customer_page import ROWS, on_customer_section, table, when
from crm.models import Customer


def _reason(message: WhatsappMessage | EmailMessage) -> str:
    """Why it was skipped, failed or bounced, in the page's language when it is one of ours."""
    return getattr(message, "bounce_message", "") or skip_reason_label(message.error_reason)


def messages(customer: Customer) -> str:
    """The newest WhatsApp and email messages, each channel its own table (customer_sent index)."""
    parts = []
    for label, model in (("WhatsApp", WhatsappMessage), (_("Email"), EmailMessage)):
        rows = [
            (when(m.sent_at or m.queued_at), m.campaign.name, m.get_status_display(), _reason(m))
            for m in model.objects.filter(customer=customer)
            .select_related("campaign")
            .order_by("-sent_at", "-id")[:ROWS]
        ]
        headers = [_("sent at"), _("campaign"), _("status"), _("reason")]
        parts.append(format_html("<h4>{}</h4>{}", label, table(headers, rows, empty=_("No message."))))
    return format_html("{}{}", *parts)


def segment(customer: Customer) -> str:
    latest = (
        CustomerSegment.objects.filter(organization_id=customer.organization_id)
        .order_by("-day")
        .values_list("day", flat=True)
        .first()
    )
    row = (
        CustomerSegment.objects.filter(
            organization_id=customer.organization_id, day=latest, customer=customer
        ).first()
        if latest
        else None
    )
    if row is None:
        return format_html('<p class="help">{}</p>', _("Not in a segment snapshot yet."))
    return format_html(
        '<p>{} <span class="help">({}: R{} F{} M{})</span></p>',
        row.get_segment_display(),
        row.day,
        row.r_score or "—",
        row.f_score or "—",
        row.m_score or "—",
    )


on_customer_section("messages", gettext_lazy("Messages"), messages, order=30)
on_customer_section("segment", gettext_lazy("Segment"), segment, order=20)
