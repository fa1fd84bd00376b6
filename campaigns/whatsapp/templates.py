"""A WhatsApp campaign's template message for one customer: its values, links and store name."""

from __future__ import annotations

from campaigns import links
from campaigns.models import Campaign, WhatsappMessage
from campaigns.variables import customer_variables
from crm.models import Customer, Store
from integrations.models import WhatsappNumber
from integrations.whatsapp.client import TemplateMessage, UrlButton
from integrations.whatsapp.parameters import template_text


def template_values(*, customer: Customer, sources: list[str], store_name: str) -> list[str]:
    """The template's body values for a customer, as Meta gets them (folded white space, its length
    limit: integrations.whatsapp.parameters); "" for one that is empty."""
    values = customer_variables(customer, store_name=store_name)
    return [template_text(values.get(source, "")) for source in sources]


def _link(kind: str, message: WhatsappMessage) -> str:
    # A template's URL button ends in a variable ("https://<our host>/{{1}}"). The seed put a
    # __REDIRECT_URL__ sentinel there and replaced it per message; the value here is the
    # message's signed redirect ("r/…") or unsubscribe ("u/…") path on our own host.
    return links.link_path(kind, message)


def store_names(numbers: dict[int, WhatsappNumber]) -> dict[int, str]:
    """{{store_name}} by sending number: its own store, else the first store that sends from it."""
    names = {pk: n.store.name for pk, n in numbers.items() if n.store}
    others = [pk for pk in numbers if pk not in names]
    if others:
        sending = Store.objects.filter(whatsapp_number_id__in=others).order_by("-pk")
        names.update(sending.values_list("whatsapp_number_id", "name"))  # the lowest pk comes last
    return names


def _empty_variable(campaign: Campaign, body: list[str]) -> str:
    """Meta refuses a template with an empty variable (131008): the first one's reason, or ""."""
    empty = [i + 1 for i, v in enumerate(body) if not v]
    if not empty:
        return ""
    return f"empty template variable {{{{{empty[0]}}}}} ({campaign.template_variables[empty[0] - 1]})"


def _template_message(campaign: Campaign, m: WhatsappMessage, body: list[str]) -> TemplateMessage:
    """The template as Meta takes it for this message: body values, header image, URL buttons."""
    return template_message(
        campaign,
        to=m.phone,
        body=body,
        links={"r": _link("r", m), "u": _link("u", m)},
        callback=f"m:{m.pk}",
    )


def template_message(
    campaign: Campaign, *, to: str, body: list[str], links: dict[str, str], callback: str
) -> TemplateMessage:
    """The campaign's template as Meta takes it, to `to` (E.164): body values, header image, its URL
    buttons ending in `links["r"]` (redirect) and `links["u"]` (unsubscribe). A campaign message's
    and a test send's (campaigns.test_sends) are the same."""
    buttons = []
    if campaign.redirect_button_index is not None:
        buttons.append(UrlButton(campaign.redirect_button_index, links["r"]))
    if campaign.unsubscribe_button_index is not None:
        buttons.append(UrlButton(campaign.unsubscribe_button_index, links["u"]))
    return TemplateMessage(
        to=to.lstrip("+"),
        template=campaign.template_name,
        language=campaign.template_language,
        body=body,
        header_image_url=campaign.header_image_url,
        buttons=buttons,
        biz_opaque_callback_data=callback,
    )
