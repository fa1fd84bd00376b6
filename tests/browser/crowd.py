"""A crowded organization for the list-width test: every list the demo manager reaches, filled past a
page with what a real retailer's desk holds after a year — long names, long addresses and links, long
provider errors, amounts in the millions, every status — not only the demo's 30 customers.

Each model's rows are copies of one the demo made (so foreign keys, JSON and encrypted fields are
real), varied field by field: every choice of each choice field in turn, long realistic text by the
field's name, big numbers where the field is a count or an amount. A copy the database refuses
(a unique or check constraint) is left out; `crowd` returns how many rows each model holds."""

from __future__ import annotations

from decimal import Decimal
from itertools import cycle
from typing import Any

from django.db import DataError, IntegrityError, models, transaction
from django.utils import timezone

ROWS = 120  # more than one admin page (100 rows)

PEOPLE = (
    "Maria Aparecida dos Santos Cavalcanti de Albuquerque",
    "José Carlos Nascimento Figueiredo Junior",
    "Ana Beatriz Rodrigues Vasconcelos Montenegro",
    "Francisco das Chagas Pereira da Silva Neto",
)
THINGS = (
    "Liquidação de Verão das Lojas do Centro — Clientes VIP e Aniversariantes do Mês",
    "Reativação de clientes sem compra há 180 dias (cupom de 15% válido até domingo)",
    "Pesquisa de satisfação pós-compra — Unidade Shopping Iguatemi Campinas",
)
ERRORS = (
    "(#131026) Message undeliverable: the receiver is incapable of receiving this message "
    "(https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/)",
    "550 5.1.1 <maria.aparecida.santos.cavalcanti@provedor-de-email-exemplo.com.br>: "
    "Recipient address rejected: User unknown in virtual mailbox table",
    "ERP answered 503 Service Unavailable for GET /api/v2/vendas?loja=0042&data=2026-11-30 after 3 tries",
)
URL = "https://www.lojasdocentro-exemplo.com.br/promocoes/natal-2026/clientes-vip?utm_source=whatsapp&utm_campaign=natal-vip-{i}"
EMAIL = "maria.aparecida.santos.cavalcanti.{i}@provedor-de-email-exemplo.com.br"
# Fields whose values are numbers a year of business makes big.
# Foreign keys the copies spread over (one message per customer and campaign, one survey per sale).
SPREAD = ("customer", "sale", "campaign", "enrollment", "execution", "store")
# Models crowded first, as the others' copies spread over their rows.
FIRST = ("crm.store", "crm.customer", "crm.sale", "campaigns.campaign")
BIG = (
    "count",
    "total",
    "sent",
    "delivered",
    "read",
    "revenue",
    "cost",
    "amount",
    "price",
    "spent",
    "recipients",
)


def _text(field: models.Field, i: int) -> str | None:
    name = field.name
    if "email" in name or "address" in name:
        value = EMAIL.format(i=i)
    elif "url" in name or "link" in name:
        value = URL.format(i=i)
    elif "phone" in name or name in ("to", "wa_id"):
        value = f"+55119{i:08d}"
    elif "error" in name or "reason" in name or "detail" in name or "message" in name:
        value = ERRORS[i % len(ERRORS)]
    elif name in ("name", "full_name", "first_name", "customer_name", "title", "subject", "label"):
        value = f"{(PEOPLE if 'customer' in str(field.model._meta.model_name) else THINGS)[i % 3]} {i}"
    else:
        return None
    return value[: field.max_length] if field.max_length else value


def _big(field: models.Field) -> Any:
    if isinstance(field, models.DecimalField):
        whole = min(7, field.max_digits - field.decimal_places)
        cents = "." + "89"[: field.decimal_places] if field.decimal_places else ""
        return Decimal("1234567890"[:whole] + cents)
    return 1_234_567


def _unique_names(model: type[models.Model]) -> set[str]:
    names = {f.name for f in model._meta.concrete_fields if f.unique}
    for constraint in model._meta.total_unique_constraints:
        names.update(constraint.fields)
    for together in model._meta.unique_together:
        names.update(together)
    return names


def _targets(field: models.ForeignKey, template: models.Model) -> list[Any]:
    """Rows of the field's model of the template's organization, for copies to spread over."""
    related: Any = field.related_model
    target = related._default_manager.order_by("-pk")
    org_id = getattr(template, "organization_id", None)
    if org_id is not None and any(f.name == "organization" for f in related._meta.fields):
        target = target.filter(organization_id=org_id)
    return list(target.values_list("pk", flat=True)[:ROWS])


def _copies(template: models.Model, model: type[models.Model]) -> list[models.Model]:
    fields = [f for f in model._meta.concrete_fields if not f.primary_key and not f.auto_created]
    unique = _unique_names(model)
    spread = {
        f.attname: cycle(_targets(f, template))
        for f in fields
        if isinstance(f, models.ForeignKey) and f.name in SPREAD
    }
    choices = {f.name: cycle([value for value, _ in f.flatchoices]) for f in fields if f.choices}
    rows = []
    for i in range(ROWS):
        row = model(**{f.attname: getattr(template, f.attname) for f in model._meta.concrete_fields})
        row.pk = None
        for attname, values in spread.items():
            setattr(row, attname, next(values))
        for f in fields:
            if isinstance(f, models.ForeignKey):
                continue
            if f.name in unique and isinstance(getattr(template, f.attname), str):
                setattr(row, f.attname, f"{getattr(template, f.attname)}-{i}"[: f.max_length])
            elif f.name in choices:
                setattr(row, f.attname, next(choices[f.name]))
            elif isinstance(f, models.BooleanField) and not f.null:
                setattr(row, f.attname, bool(i % 2))
            elif isinstance(f, (models.CharField, models.TextField)) and not isinstance(
                f, (models.SlugField, models.URLField)
            ):
                text = _text(f, i)
                if text is not None:
                    setattr(row, f.attname, text)
            elif isinstance(f, models.URLField):
                setattr(row, f.attname, URL.format(i=i)[: f.max_length])
            elif isinstance(f, (models.IntegerField, models.DecimalField)) and any(b in f.name for b in BIG):
                setattr(row, f.attname, _big(f))
        rows.append(row)
    return rows


def _first_target(field: models.ForeignKey, org_id: int) -> Any:
    """A row for a new row's foreign key: the organization's first (an unused one for a one-to-one)."""
    related: Any = field.related_model
    if related._meta.label_lower == "crm.organization":
        return org_id
    target = related._default_manager.order_by("pk")
    if any(g.name == "organization" for g in related._meta.fields):
        target = target.filter(organization_id=org_id)
    if isinstance(field, models.OneToOneField):
        target = target.exclude(**{f"{field.related_query_name()}__isnull": False})
    return target.values_list("pk", flat=True).first()


def _value(field: models.Field, n: int) -> Any:
    """A value for a required field that is not a foreign key: its first choice, a text, 1, now."""
    if field.choices:
        return field.flatchoices[0][0]
    if isinstance(field, (models.CharField, models.TextField)):
        return (_text(field, n) or f"{field.name}-{n}")[: field.max_length]
    if isinstance(field, models.DateTimeField):
        return timezone.now()
    if isinstance(field, models.DateField):
        return timezone.localdate()
    return 1


def _one(model: type[models.Model], org_id: int, n: int) -> models.Model | None:
    """A first row of a model the demo left empty, from its required fields alone; None while a
    foreign key's model has no row to point at."""
    values: dict[str, Any] = {}
    for f in model._meta.concrete_fields:
        if f.primary_key or f.null or f.has_default() or getattr(f, "auto_now_add", False):
            continue
        if getattr(f, "auto_now", False):
            continue
        value = _first_target(f, org_id) if isinstance(f, models.ForeignKey) else _value(f, n)
        if value is None:
            return None
        values[f.attname] = value
    with transaction.atomic():
        return model._default_manager.create(**values)


def crowd(labels: list[tuple[str, str]], org_id: int) -> dict[str, int]:
    """Fill each (app_label, model_name)'s table past a page; the rows each holds afterwards."""
    from django.apps import apps

    wanted = sorted(
        (apps.get_model(a, m) for a, m in labels),
        key=lambda model: (
            model._meta.label_lower not in FIRST,
            FIRST.index(model._meta.label_lower) if model._meta.label_lower in FIRST else 0,
        ),
    )
    empty = [model for model in wanted if not model._default_manager.exists()]
    for _pass in range(len(empty)):  # parents before children
        empty = [model for model in empty if _one(model, org_id, _pass) is None]
    for model in wanted:
        template = model._default_manager.order_by("-pk").first()
        if template is None:
            continue
        rows = _copies(template, model)
        try:
            with transaction.atomic():
                model._default_manager.bulk_create(rows, ignore_conflicts=True)
        except (DataError, IntegrityError, ValueError, TypeError):
            for row in rows:  # one by one: the database refuses some combinations
                try:
                    with transaction.atomic():
                        model._default_manager.bulk_create([row], ignore_conflicts=True)
                except (DataError, IntegrityError, ValueError, TypeError):
                    continue
    return {model._meta.label_lower: model._default_manager.count() for model in wanted}
