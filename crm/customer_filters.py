"""One customer filter: the customers of an organization narrowed by what a manager picks —
store, last purchase between two days, number of purchases, total spent, RFM segment, birthday
month, channel consent —, combined (every term set must hold).

Campaign audiences (Campaign.audience_filter), the customer list and flow conditions use it: the
same JSON (`to_json`/`from_json`) and the same SQL. The purchase terms are one GROUP BY of the
organization's sales joined by customer (an aggregate, never a row per customer in Python); the
RFM segment is the campaigns app's (its snapshots), registered with `segment_lookup_register`
(the platform imports no app).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet, Sum
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from crm.models import Customer, Sale

CHANNELS = ("whatsapp", "email")

# (organization id, segment) -> the customers in that segment now (a queryset of customer ids).
SegmentLookup = Callable[[int, str], QuerySet]
_segment_lookup: list[SegmentLookup] = []
_segment_choices: list[tuple[str, Any]] = []


def segment_lookup_register(lookup: SegmentLookup, choices: list[tuple[str, Any]]) -> None:
    """Where the RFM segment term reads its customers, and the segments (value, label) it offers
    (the campaigns app registers its snapshots)."""
    _segment_lookup[:] = [lookup]
    _segment_choices[:] = choices


@dataclass(frozen=True)
class CustomerFilter:
    """The terms a manager set (None or "" = not set). Dates are days in the organization's zone."""

    store_id: int | None = None
    last_purchase_from: date | None = None
    last_purchase_to: date | None = None
    purchases_min: int | None = None
    purchases_max: int | None = None
    spent_min: Decimal | None = None
    spent_max: Decimal | None = None
    segment: str = ""
    birthday_month: int | None = None
    consent_channel: str = ""  # "whatsapp" or "email": consent given, not opted out, a contact there

    def is_empty(self) -> bool:
        return not any(getattr(self, f.name) not in (None, "") for f in dataclasses.fields(self))

    def to_json(self) -> dict[str, Any]:
        """The terms set, as JSON values (dates ISO, amounts as strings)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value in (None, ""):
                continue
            out[f.name] = (
                value.isoformat()
                if isinstance(value, date)
                else str(value)
                if isinstance(value, Decimal)
                else value
            )
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> CustomerFilter:
        """The filter of `data` (to_json's output, or a query string's values); ValueError names a
        term that cannot be read. Unknown keys are ignored."""
        data = data or {}
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = data.get(f.name)
            if raw in (None, ""):
                continue
            kwargs[f.name] = _parse(f.name, raw)
        return cls(**kwargs)

    def _purchase_terms(self) -> Q:
        terms = Q()
        if self.last_purchase_from:
            terms &= Q(last__gte=_start_of(self.last_purchase_from))
        if self.last_purchase_to:
            terms &= Q(last__lt=_start_of(self.last_purchase_to + timedelta(days=1)))
        if self.purchases_min is not None:
            terms &= Q(n__gte=self.purchases_min)
        if self.purchases_max is not None:
            terms &= Q(n__lte=self.purchases_max)
        if self.spent_min is not None:
            terms &= Q(total__gte=self.spent_min)
        if self.spent_max is not None:
            terms &= Q(total__lte=self.spent_max)
        return terms

    def apply(self, qs: QuerySet[Customer], *, organization_id: int | None) -> QuerySet[Customer]:
        """`qs` (customers of `organization_id`; of any when None, and the RFM segment term then
        needs one) narrowed by every term set."""
        if self.store_id:
            qs = qs.filter(Exists(Sale.objects.filter(customer_id=OuterRef("pk"), store_id=self.store_id)))
        purchases = self._purchase_terms()
        if purchases:
            sales = (
                Sale.objects.filter(organization_id=organization_id)
                if organization_id is not None
                else Sale.objects.filter(customer_id__in=qs.values("pk"))
            )
            buyers = (
                sales.filter(customer_id__isnull=False)
                .values("customer_id")
                .annotate(n=Count("pk"), total=Sum("total"), last=Max("sold_at"))
                .filter(purchases)
                .values("customer_id")
            )
            # "At most N purchases" includes who never bought (0 ≤ N) unless another term needs a sale.
            never = self.purchases_min in (None, 0) and self.spent_min in (None, Decimal(0))
            never = never and not (self.last_purchase_from or self.last_purchase_to)
            selected = Q(pk__in=buyers)
            if never:
                selected |= Q(~Exists(Sale.objects.filter(customer_id=OuterRef("pk"))))
            qs = qs.filter(selected)
        if self.segment:
            if not _segment_lookup or organization_id is None:
                raise ValueError("the RFM segment term needs one organization and a segment lookup")
            qs = qs.filter(pk__in=_segment_lookup[0](organization_id, self.segment))
        if self.birthday_month:
            qs = qs.filter(birth_date__month=self.birthday_month)
        if self.consent_channel == "whatsapp":
            qs = qs.filter(marketing_consent=True, whatsapp_opted_out_at__isnull=True).exclude(phone="")
        elif self.consent_channel == "email":
            qs = qs.filter(marketing_consent=True, email_opted_out_at__isnull=True).exclude(email="")
        return qs


# Every term, in the order forms show them.
TERMS = tuple(f.name for f in dataclasses.fields(CustomerFilter))


def customers_filtered(*, organization_id: int, customer_filter: CustomerFilter) -> QuerySet[Customer]:
    """The organization's customers the filter selects."""
    return customer_filter.apply(
        Customer.objects.filter(organization_id=organization_id), organization_id=organization_id
    )


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def _parse(name: str, raw: Any) -> Any:
    try:
        if name in ("last_purchase_from", "last_purchase_to"):
            return raw if isinstance(raw, date) else date.fromisoformat(str(raw))
        if name in ("spent_min", "spent_max"):
            value = Decimal(str(raw).replace(",", "."))
            if not value.is_finite() or value < 0:
                raise ValueError(name)
            return value
        if name in ("store_id", "purchases_min", "purchases_max", "birthday_month"):
            number = int(str(raw))
            if number < 0 or (name == "birthday_month" and not 1 <= number <= 12):
                raise ValueError(name)
            return number
        if name == "consent_channel" and str(raw) not in CHANNELS:
            raise ValueError(name)
        return str(raw)
    except (InvalidOperation, ValueError, TypeError):
        raise ValueError(f"{name}: {raw!r} cannot be read") from None


def form_fields(
    *, terms: tuple[str, ...], prefix: str = "", stores: Iterable[tuple[int, str]] | None = None
) -> dict[str, forms.Field]:
    """Form fields for the filter's `terms` (its field names), named as the terms: the customer
    list's filter and the campaign's audience section build their forms from them. Given one
    organization's `stores` (id, name), the store is picked by its name, not typed as an id."""
    made: dict[str, forms.Field] = {
        "last_purchase_from": forms.DateField(
            required=False, label=_("last purchase from"), widget=forms.DateInput(attrs={"type": "date"})
        ),
        "last_purchase_to": forms.DateField(
            required=False, label=_("last purchase until"), widget=forms.DateInput(attrs={"type": "date"})
        ),
        "store_id": forms.IntegerField(required=False, min_value=1, label=_("bought at store (id)")),
        "purchases_min": forms.IntegerField(required=False, min_value=0, label=_("at least N purchases")),
        "purchases_max": forms.IntegerField(required=False, min_value=0, label=_("at most N purchases")),
        "spent_min": forms.DecimalField(required=False, min_value=0, label=_("spent at least (R$)")),
        "spent_max": forms.DecimalField(required=False, min_value=0, label=_("spent at most (R$)")),
        "birthday_month": forms.TypedChoiceField(
            required=False,
            coerce=int,
            empty_value=None,
            choices=[("", "—"), *[(str(m), name) for m, name in enumerate(_MONTH_NAMES, start=1)]],
            label=_("birthday month"),
        ),
        "segment": forms.ChoiceField(
            required=False, choices=[("", "—"), *_segment_choices], label=_("RFM segment")
        ),
        "consent_channel": forms.ChoiceField(
            required=False,
            choices=[("", "—"), ("whatsapp", "WhatsApp"), ("email", _("email"))],
            label=_("may receive marketing on"),
        ),
    }
    if stores is not None:
        made["store_id"] = forms.TypedChoiceField(
            required=False,
            coerce=int,
            empty_value=None,
            choices=[("", "—"), *((str(pk), name) for pk, name in stores)],
            label=_("bought at store"),
        )
    return {prefix + name: made[name] for name in terms}


def from_cleaned(
    data: Mapping[str, Any], *, prefix: str = "", base: CustomerFilter | None = None
) -> CustomerFilter:
    """The filter of a form's cleaned data (fields from form_fields, named `prefix` + term), the
    terms not in the form kept from `base`."""
    values = dataclasses.asdict(base or CustomerFilter())
    for f in dataclasses.fields(CustomerFilter):
        if prefix + f.name in data:
            values[f.name] = data[prefix + f.name]
    return CustomerFilter(**values)


_MONTH_NAMES = (
    _("January"),
    _("February"),
    _("March"),
    _("April"),
    _("May"),
    _("June"),
    _("July"),
    _("August"),
    _("September"),
    _("October"),
    _("November"),
    _("December"),
)
