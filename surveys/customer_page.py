"""The surveys' part of the customer's admin page (crm.customer_page): their surveys and answers."""

from __future__ import annotations

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from crm.customer_page import ROWS, on_customer_section, table, when
from crm.models import Customer
from surveys.models import Survey


def answers(customer: Customer) -> str:
    rows = [
        (
            when(s.sent_at),
            s.get_status_display(),
            "—" if s.score is None else s.score,
            s.comment,
            when(s.answered_at),
        )
        for s in Survey.objects.filter(customer=customer).order_by("-sent_at", "-id")[:ROWS]
    ]
    headers = [_("sent at"), _("status"), _("score"), _("comment"), _("answered at")]
    return table(headers, rows, empty=_("No survey."))


on_customer_section("surveys", gettext_lazy("Survey answers"), answers, order=50)
