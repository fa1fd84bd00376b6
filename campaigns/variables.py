"""Template variables: what a campaign's WhatsApp template or email may say about its recipient,
in one place for both channels (the WhatsApp body parameters, the email's `{{ first_name }}`)."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _

from crm.models import Customer
from crm.names import first_name

# The values a template variable may take, by name (the admin offers them; a WhatsApp campaign
# names one per body parameter, an email uses them as {{ name }}).
VARIABLE_SOURCES = {
    "first_name": _("first name"),
    "name": _("full name"),
    "email": _("email"),
    "store_name": _("store name"),
}


# The customer's fields the variables read: a send loads only these (and what consent needs).
CUSTOMER_FIELDS = ("name", "email")


def customer_variables(customer: Customer, *, store_name: str) -> dict[str, str]:
    """Every template variable's raw value for a customer ("" when it has none)."""
    return {
        "first_name": first_name(customer.name or ""),
        "name": customer.name or "",
        "email": customer.email or "",
        "store_name": store_name,
    }
