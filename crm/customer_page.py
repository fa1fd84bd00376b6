"""The customer's admin page shows the person, and its search finds a customer however a phone or a
CPF is typed.

Sections: each app adds what it knows about a customer through `on_customer_section` (from its
`AppConfig.ready`), since crm imports no domain app: crm the purchases, campaigns the messages by
channel with their status and the RFM segment, surveys the answers; a conversations app adds the
replies the same way (name "replies", order 40, between the messages and the surveys). Each section
renders at most a page of rows, newest first, with index-served queries (the page of one customer).

Search: a term that reads as a phone (`(11) 99000-0000`, `11990000000`, `+55 11 99000-0000`) is
looked up as its E.164 form, one that reads as a CPF/CNPJ (with or without punctuation) as its
digits: equality on `customer_org_phone` / `customer_org_cpf_cnpj` for each organization the user
sees, never a scan of the names of a million customers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet, Sum
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.timezone import localtime
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from crm.models import Customer, Sale
from crm.money import format_money
from integrations.whatsapp.phones import normalize_phone

MATCHES = 100  # customers one typed phone or CPF may name (shared family phones)
ROWS = 20  # a section shows the newest rows; the lists (filtered by customer) have the rest

Render = Callable[[Customer], str]


@dataclass(frozen=True)
class Section:
    name: str
    title: Any
    render: Render
    order: int


_SECTIONS: dict[str, Section] = {}


def on_customer_section(name: str, title: Any, render: Render, *, order: int = 0) -> None:
    """Add (or replace) a section of the customer's page: `render(customer)` returns safe HTML."""
    _SECTIONS[name] = Section(name, title, render, order)


def customer_sections(customer: Customer) -> list[tuple[Any, str]]:
    """(title, html) of every registered section, by order."""
    return [
        (s.title, s.render(customer)) for s in sorted(_SECTIONS.values(), key=lambda s: (s.order, s.name))
    ]


def table(headers: list[Any], rows: list[tuple[Any, ...]], *, empty: Any) -> str:
    """A small HTML table (the sections' shape), or the `empty` sentence."""
    if not rows:
        return format_html('<p class="help">{}</p>', empty)
    head = format_html_join("", "<th>{}</th>", ((h,) for h in headers))
    body = format_html_join(
        "", "<tr>{}</tr>", ((format_html_join("", "<td>{}</td>", ((v,) for v in row)),) for row in rows)
    )
    return format_html("<table><tr>{}</tr>{}</table>", head, body)


def when(value: Any) -> str:
    return date_format(localtime(value), "SHORT_DATETIME_FORMAT") if value else "—"


def purchases(customer: Customer) -> str:
    sales = Sale.objects.filter(customer=customer)
    total = sales.aggregate(total=Sum("total"))["total"]
    rows = [
        (when(s.sold_at), s.store.name, format_money(s.total, "BRL"), s.erp_id)
        for s in sales.select_related("store").order_by("-sold_at")[:ROWS]
    ]
    summary = format_html(
        "<p>{}</p>",
        _("%(count)s purchase(s), %(total)s in all")
        % {"count": sales.count(), "total": format_money(total or 0, "BRL")},
    )
    return format_html(
        "{}{}",
        summary,
        table([_("sold at"), _("store"), _("total"), _("ERP id")], rows, empty=_("No purchase yet.")),
    )


on_customer_section("purchases", gettext_lazy("Purchases"), purchases, order=10)


# --- search -------------------------------------------------------------------------------------


def _digits(term: str) -> str:
    return "".join(ch for ch in term if ch.isdigit())


def looks_like_number(term: str) -> bool:
    """Digits with at most phone or CPF punctuation: "(11) 99000-0000", "123.456.789-09", "+55 11 …"."""
    stripped = term.strip()
    return (
        bool(stripped)
        and len(_digits(stripped)) >= 8
        and all(ch.isdigit() or ch in "+()-./ " for ch in stripped)
    )


def number_search(
    queryset: QuerySet[Customer], term: str, *, organization_ids: list[int]
) -> QuerySet[Customer]:
    """Customers whose phone (E.164) or CPF/CNPJ (digits) is the number typed in `term`, in these
    organizations: one equality probe of `customer_org_phone` and one of `customer_org_cpf_cnpj`
    (each kept apart: an OR of the two would let the planner read a whole organization), at most
    MATCHES ids each, then the list's own query over those ids."""
    digits = _digits(term)
    scoped = Customer.objects.filter(organization_id__in=organization_ids).order_by()
    ids: list[int] = []
    if len(digits) in (11, 14):
        ids += scoped.filter(cpf_cnpj=digits).values_list("pk", flat=True)[:MATCHES]
    phone = normalize_phone(term) if len(digits) <= 15 else None
    if phone:
        ids += scoped.filter(phone=phone).values_list("pk", flat=True)[:MATCHES]
    return queryset.filter(pk__in=ids)
