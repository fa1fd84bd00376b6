"""The conversation on the customer's admin page (crm.customer_page): the latest messages both ways,
and a link to the whole conversation, where a manager answers inside the 24-hour window."""

from __future__ import annotations

from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _

from crm.customer_page import ROWS, table, when
from crm.models import Customer
from messaging.models import ConversationMessage


def replies(customer: Customer) -> str:
    rows = [
        (
            when(m.at),
            _("customer") if m.direction == ConversationMessage.Direction.INBOUND else m.get_source_display(),
            f"[{m.kind}] {m.text}" if m.kind != "text" else m.text,
            "" if m.direction == ConversationMessage.Direction.INBOUND else m.get_status_display(),
        )
        for m in ConversationMessage.objects.filter(customer=customer).order_by("-at", "-id")[:ROWS]
    ]
    return format_html(
        '{}<p><a id="customer-conversation" href="{}">{}</a></p>',
        table([_("at"), _("from"), _("message"), _("status")], rows, empty=_("No WhatsApp conversation.")),
        reverse("admin:messaging_conversation", args=[customer.pk]),
        _("Open the conversation (and reply)"),
    )
