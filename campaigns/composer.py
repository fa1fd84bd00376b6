"""The campaign composer: a WhatsApp template picked from those Meta approved for the sender's
business account (integrations.WhatsappTemplate, synced), each `{{n}}` of its body mapped to a
named customer variable (campaigns/variables.py) from a dropdown, and the message rendered for a
real customer from the number it will go from.

`template_problem` is the one check of a campaign's template against what Meta said: the form
refuses to save it, `lifecycle.campaign_validate` refuses to start it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.db.models import QuerySet
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from campaigns.models import AUDIENCE_MAX_DAYS, Campaign, Channel, Segment, Sender
from campaigns.recurrence import recurrence_error
from campaigns.variables import VARIABLE_SOURCES
from campaigns.whatsapp.templates import store_names, template_values
from crm.customer_filters import TERMS, CustomerFilter, form_fields, from_cleaned
from crm.models import Customer, Organization, Sale
from integrations.models import PriceCategory, WhatsappNumber, WhatsappTemplate

MAX_VARIABLES = 10
_VARIABLE_RE = re.compile(r"\{\{\s*(\d{1,3})\s*\}\}")


def selectable_templates(*, organization_id: int) -> QuerySet[WhatsappTemplate]:
    """The templates a campaign of the organization may pick: approved by Meta, fillable by our sends."""
    return WhatsappTemplate.objects.filter(
        organization_id=organization_id, status=WhatsappTemplate.Status.APPROVED, unsupported_reason=""
    ).order_by("name", "language")


def campaign_template(campaign: Campaign) -> WhatsappTemplate | None:
    """The synced template the campaign names, in its number's business account; None when unknown."""
    number = campaign.whatsapp_number
    if number is None or not number.business_account_id:
        return None
    return WhatsappTemplate.objects.filter(
        organization_id=campaign.organization_id,
        business_account_id=number.business_account_id,
        name=campaign.template_name,
        language=campaign.template_language,
    ).first()


def template_problem(campaign: Campaign) -> str:
    """Why the campaign's template cannot be sent as Meta has it now, or "". A number whose business
    account has no synced template is not checked (its templates were never read)."""
    number = campaign.whatsapp_number
    if number is None or not number.business_account_id:
        return ""
    template = campaign_template(campaign)
    if template is None:
        synced = WhatsappTemplate.objects.filter(
            organization_id=campaign.organization_id, business_account_id=number.business_account_id
        ).exists()
        if not synced:
            return ""
        return _("template %(name)s (%(language)s) is not among the business account's templates") % {
            "name": campaign.template_name,
            "language": campaign.template_language,
        }
    if template.status != WhatsappTemplate.Status.APPROVED:
        return _("template %(name)s is %(status)s at Meta: it cannot be sent") % {
            "name": template.name,
            "status": template.get_status_display(),
        }
    if template.unsupported_reason:
        return _("template %(name)s cannot be filled: %(reason)s") % {
            "name": template.name,
            "reason": template.unsupported_reason,
        }
    if len(campaign.template_variables) != template.variable_count:
        return _("template %(name)s has %(expected)s variable(s); %(mapped)s mapped") % {
            "name": template.name,
            "expected": template.variable_count,
            "mapped": len(campaign.template_variables),
        }
    return ""


def render_body(body: str, values: list[str]) -> str:
    """The template's body with {{n}} replaced by the n-th value (a missing one stays as {{n}})."""

    def value(match: re.Match[str]) -> str:
        index = int(match.group(1)) - 1
        return values[index] if 0 <= index < len(values) else match.group(0)

    return _VARIABLE_RE.sub(value, body)


class TemplateSelect(forms.Select):
    """Each option carries what the page's script needs to fill the rest of the form and to show
    the message: business account, language, category, variable count, body, buttons."""

    def create_option(self, name: str, value: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        option = super().create_option(name, value, *args, **kwargs)
        template = getattr(value, "instance", None)
        if isinstance(template, WhatsappTemplate):
            option["attrs"].update(
                {
                    "data-waba": template.business_account_id,
                    "data-name": template.name,
                    "data-language": template.language,
                    "data-category": template.category.lower(),
                    "data-variables": str(template.variable_count),
                    "data-body": template.body,
                    "data-buttons": json.dumps(template.buttons),
                }
            )
        return option


class TemplateChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: WhatsappTemplate) -> str:
        return f"{obj.name} ({obj.language}) — {obj.get_category_display()}"


class VariablesWidget(forms.Widget):
    """{{1}}…{{MAX_VARIABLES}} as dropdowns of named customer variables (the page shows as many as
    the template has). A posted JSON list under the field's own name is read too (scripts, the API
    of older forms)."""

    def value_from_datadict(self, data: Any, files: Any, name: str) -> Any:
        if name in data:
            return data.get(name)
        picked = [data.get(f"{name}_{i}", "") for i in range(MAX_VARIABLES)]
        while picked and not picked[-1]:
            picked.pop()
        return picked

    def value_omitted_from_data(self, data: Any, files: Any, name: str) -> bool:
        return name not in data and f"{name}_0" not in data

    def render(self, name: str, value: Any, attrs: Any = None, renderer: Any = None) -> SafeString:
        chosen = value if isinstance(value, list) else []
        rows = []
        for i in range(MAX_VARIABLES):
            current = chosen[i] if i < len(chosen) else ""
            options = format_html_join(
                "",
                '<option value="{}"{}>{}</option>',
                [("", "", "—")]
                + [
                    (key, " selected" if key == current else "", label)
                    for key, label in VARIABLE_SOURCES.items()
                ],
            )
            rows.append(
                format_html(
                    '<p class="template-variable" data-index="{}"><label for="id_{}_{}">{{{{{}}}}}</label> '
                    '<select name="{}_{}" id="id_{}_{}">{}</select></p>',
                    i + 1,
                    name,
                    i,
                    i + 1,
                    name,
                    i,
                    name,
                    i,
                    options,
                )
            )
        return format_html(
            '<div id="template-variables">{}</div>', format_html_join("", "{}", ((r,) for r in rows))
        )


class VariablesField(forms.Field):
    widget = VariablesWidget

    def to_python(self, value: Any) -> list[str]:
        if isinstance(value, str):
            try:
                value = json.loads(value or "[]")
            except ValueError:
                raise forms.ValidationError(_("Enter a list of variable names.")) from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise forms.ValidationError(_("Enter a list of variable names."))
        unknown = [v for v in value if v not in VARIABLE_SOURCES]
        if unknown:
            raise forms.ValidationError(
                _("Unknown variable(s): %(unknown)s. Choose from %(known)s.")
                % {"unknown": ", ".join(repr(v) for v in unknown), "known": ", ".join(VARIABLE_SOURCES)}
            )
        if len(value) > MAX_VARIABLES:
            raise forms.ValidationError(_("At most %(n)s variables.") % {"n": MAX_VARIABLES})
        return value


class CampaignForm(forms.ModelForm):
    """The campaign's form with the template picker and the variable dropdowns."""

    whatsapp_template = TemplateChoiceField(
        queryset=WhatsappTemplate.objects.none(),
        required=False,
        widget=TemplateSelect,
        label=gettext_lazy("template"),
        help_text=gettext_lazy(
            "The templates Meta approved for the number's WhatsApp Business account (rejected and paused "
            "ones are not offered). Missing one? Sync them on the WhatsApp templates page."
        ),
    )
    template_variables = VariablesField(
        required=False,
        label=gettext_lazy("template variables"),
        help_text=gettext_lazy("What each {{n}} of the template's body says, for each customer."),
    )

    class Meta:
        model = Campaign
        fields = ("organization", "name")  # the admin gives the form its fieldsets' fields

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "control_percent" in self.fields:  # left out (a script's form, an old page): no control group
            self.fields["control_percent"].required = False
        self._audience_filter_init()
        field = self.fields.get("whatsapp_template")
        if field is None:
            return
        org_id = (
            self.data.get("organization") or self.initial.get("organization") or self.instance.organization_id
        )
        if str(org_id or "").isdigit():
            field.queryset = selectable_templates(organization_id=int(org_id))  # type: ignore[attr-defined]
            if self.instance.pk and self.instance.template_name:
                field.initial = campaign_template(self.instance)

    def clean_control_percent(self) -> int:
        value = self.cleaned_data.get("control_percent")
        return 0 if value is None else value

    def clean_recurrence(self) -> str:
        """Recurrence in words ("toda segunda 9h") is refused with examples of what works."""
        value = (self.cleaned_data.get("recurrence") or "").strip()
        problem = recurrence_error(value) if value else ""
        if problem:
            raise forms.ValidationError(problem)
        return value

    def _audience_filter_init(self) -> None:
        """The audience's filter terms shown from the campaign's audience_filter; fixed once it started."""
        stored = CustomerFilter.from_json(self.instance.audience_filter or {}).to_json()
        for term in AUDIENCE_TERMS:
            field = self.fields.get(AUDIENCE_PREFIX + term)
            if field is None:
                continue
            field.initial = stored.get(term)
            field.disabled = self.instance.pk is not None and self.instance.content_locked

    def _audience_filter_clean(self, data: dict[str, Any]) -> None:
        if AUDIENCE_PREFIX + AUDIENCE_TERMS[0] not in self.fields:
            return
        base = CustomerFilter.from_json(self.instance.audience_filter or {})
        self.instance.audience_filter = from_cleaned(data, prefix=AUDIENCE_PREFIX, base=base).to_json()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        self._audience_filter_clean(data)
        template = data.get("whatsapp_template")
        if template is None or "template_name" not in self.fields:  # none picked, or content locked
            return data
        number: WhatsappNumber | None = data.get("whatsapp_number")
        if number is not None and number.business_account_id != template.business_account_id:
            self.add_error(
                "whatsapp_template", _("This template belongs to another WhatsApp Business account.")
            )
            return data
        data["template_name"] = template.name
        data["template_language"] = template.language
        category = template.category.lower()
        data["template_category"] = category if category in PriceCategory.values else PriceCategory.MARKETING
        mapped = data.get("template_variables") or []
        if len(mapped) != template.variable_count:
            self.add_error(
                "template_variables",
                _("The template has %(n)s variable(s): choose one customer variable for each.")
                % {"n": template.variable_count},
            )
        return data


# The audience's customer-filter terms on the campaign's form (store and RFM segment are the
# campaign's own fields; the channel's consent is always required).
AUDIENCE_PREFIX = "audience_"
AUDIENCE_TERMS = tuple(t for t in TERMS if t not in ("store_id", "segment", "consent_channel"))
AUDIENCE_FIELDS = tuple(AUDIENCE_PREFIX + term for term in AUDIENCE_TERMS)
for _name, _field in form_fields(terms=AUDIENCE_TERMS, prefix=AUDIENCE_PREFIX).items():
    CampaignForm.base_fields[_name] = _field
    CampaignForm.declared_fields[_name] = _field


class AudienceCountForm(forms.Form):
    """The campaign form's audience fields, read for the live count (an unsaved campaign)."""

    channel = forms.ChoiceField(choices=Channel.choices, required=False)
    audience_store = forms.IntegerField(required=False, min_value=1)
    audience_purchased_within_days = forms.IntegerField(
        required=False, min_value=0, max_value=AUDIENCE_MAX_DAYS
    )
    audience_segment = forms.ChoiceField(choices=[("", "—"), *Segment.choices], required=False)

    def __init__(self, *args: Any, organization: Organization, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.organization = organization
        self.fields.update(form_fields(terms=AUDIENCE_TERMS, prefix=AUDIENCE_PREFIX))

    def campaign(self) -> Campaign:
        data = self.cleaned_data
        store = data.get("audience_store")
        return Campaign(
            organization=self.organization,
            channel=data.get("channel") or Channel.WHATSAPP,
            audience_store_id=store if store and self.organization.stores.filter(pk=store).exists() else None,
            audience_purchased_within_days=data.get("audience_purchased_within_days"),
            audience_segment=data.get("audience_segment") or "",
            audience_filter=from_cleaned(data, prefix=AUDIENCE_PREFIX).to_json(),
        )


def sender_for(campaign: Campaign, customer: Customer) -> WhatsappNumber | None:
    """The number a message of the campaign to `customer` goes from, as the fan-out chooses it
    (services' sender SQL): from the customer's store, the number of the store of their latest
    sale when it has one of the organization's; else the campaign's."""
    if campaign.sender == Sender.STORE:
        latest = (
            Sale.objects.filter(customer=customer)
            .order_by("-sold_at", "-id")
            .select_related("store__whatsapp_number__store")
            .first()
        )
        number = latest.store.whatsapp_number if latest else None
        if number is not None and number.organization_id == campaign.organization_id:
            return number
    return campaign.whatsapp_number


@dataclass(frozen=True)
class Rendered:
    customer: Customer
    number: WhatsappNumber | None
    store_name: str  # {{store_name}}: the sending number's store
    values: list[str]
    text: str  # the body as the customer reads it ("" when the template is not synced)


def render_for(campaign: Campaign, customer: Customer) -> Rendered:
    """The campaign's WhatsApp message for one real customer, from the number it will go from, with
    the values the send puts in (campaigns.whatsapp.templates.template_values: the same folding)."""
    number = sender_for(campaign, customer)
    store_name = store_names({number.pk: number}).get(number.pk, "") if number else ""
    values = template_values(customer=customer, sources=campaign.template_variables, store_name=store_name)
    template = campaign_template(campaign)
    text = render_body(template.body, values) if template else ""
    return Rendered(customer, number, store_name, values, text)


def preview_html(campaign: Campaign, customers: Iterable[Customer]) -> str:
    """The message as each of these customers will read it: to whom, from which number, the text."""
    rows = []
    for customer in customers:
        rendered = render_for(campaign, customer)
        number = rendered.number
        sender = str(number.display_phone_number) if number else "—"
        if rendered.store_name:
            sender = f"{sender} ({rendered.store_name})"
        text = rendered.text or " | ".join(v or "∅" for v in rendered.values)
        rows.append((customer.name, customer.phone, sender, text))
    if not rows:
        return _("No recipient in the audience.")
    head = format_html(
        "<tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>",
        _("customer"),
        _("phone"),
        _("from"),
        _("message"),
    )
    body = format_html_join(
        "", '<tr><td>{}</td><td>{}</td><td>{}</td><td class="whatsapp-preview">{}</td></tr>', rows
    )
    return format_html('<table id="campaign-preview">{}{}</table>', head, body)
