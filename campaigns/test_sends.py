""" "Send this campaign to me": the campaign's WhatsApp message to the manager's own phone (or its
email to the manager's own address), with a chosen customer's variables, before it starts.

The message is built by the campaign send's own steps (`composer.sender_for`: the number the
customer's message would go from; `whatsapp.templates.template_values` and `template_message`: the
same values, template and buttons) and handed to the same Graph client, in a job on the
whatsapp-send queue. It is recorded as a `TestSend`, never as a campaign message: nothing is
counted, priced or capped, and the customer receives nothing. Its URL buttons lead to the
deployment's "test" path (no tracked link exists for a message that is not the campaign's).

An email campaign's test is rendered by the campaign's own compiled email with the customer's
variables (links not tracked, no open pixel) and handed to the organization's mail server or
ESP through messaging.email_transport.deliver, as a one-off message on the email-send queue."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from campaigns import composer, lifecycle, selectors
from campaigns.email.content import compiled_email, variables_for
from campaigns.models import Campaign, Channel, TestSend
from campaigns.whatsapp.templates import store_names, template_message, template_values
from crm import aio, jobs, queues
from crm.models import Customer
from integrations.clients import graph_client
from integrations.models import EmailSettings
from integrations.whatsapp.phones import normalize_phone
from messaging import email_render
from messaging.email_transport import build_message, deliver, email_transport

logger = logging.getLogger(__name__)

TEST_LINK = "t/test-send"


def test_send_request(*, campaign: Campaign, customer: Customer, to: str, user_id: int | None) -> TestSend:
    """Record a test send of a draft or scheduled WhatsApp campaign to `to` (a phone, any way it is
    typed) with `customer`'s variables and enqueue it. Raises lifecycle.CampaignError."""
    if campaign.status not in (Campaign.Status.DRAFT, Campaign.Status.SCHEDULED):
        raise lifecycle.CampaignError(_("a test send is made before the campaign starts"))
    if customer.organization_id != campaign.organization_id:
        raise lifecycle.CampaignError(_("the customer belongs to another organization"))
    address = _test_address(campaign, to)
    lifecycle.campaign_validate(campaign=campaign)
    with transaction.atomic():
        test = TestSend.objects.create(
            campaign=campaign, customer=customer, to=address, requested_by_id=user_id
        )
        jobs.enqueue(
            "campaigns.tasks.test_send",
            queue=queues.EMAIL_SEND if campaign.channel == Channel.EMAIL else queues.WHATSAPP_SEND,
            kwargs={"test_send_id": test.pk},
            organization_id=campaign.organization_id,
            attempts=1,  # a send is not retried blindly (it may have reached Meta): the manager asks again
        )
    return test


def _test_address(campaign: Campaign, to: str) -> str:
    """The manager's phone (E.164) or email address for the campaign's channel; CampaignError when
    it is not one."""
    if campaign.channel == Channel.EMAIL:
        address = to.strip()
        try:
            validate_email(address)
        except ValidationError:
            raise lifecycle.CampaignError(_("%(to)r is not an email address") % {"to": to}) from None
        return address
    phone = normalize_phone(to)
    if phone is None:
        raise lifecycle.CampaignError(_("%(to)r is not a phone number") % {"to": to})
    return phone


def _email_test_run(test: TestSend) -> str:
    """Render the campaign's email with the customer's variables and hand it over, once."""
    campaign, customer = test.campaign, test.customer
    email_settings = EmailSettings.objects.filter(organization_id=campaign.organization_id).first()
    if email_settings is None or customer is None:
        return _finish(test, error=_("no email settings, or the customer is gone"))
    store = campaign.audience_store.name if campaign.audience_store else campaign.organization.name
    rendered = email_render.render_email(
        compiled_email(campaign),
        variables=variables_for(customer, store_name=store, unsubscribe_url=TEST_LINK),
        click_url="",
        open_pixel_url=None,
    )
    message = build_message(
        email_settings=email_settings, to_name=customer.name, to_address=test.to, rendered=rendered
    )
    outcome = deliver(email_transport(email_settings), lambda: message, bulk=False)
    if outcome is None or outcome.failure or outcome.unknown or outcome.transient:
        failure = outcome.failure if outcome else None
        reason = (
            f"{failure.kind} — {failure.code or ''} {failure.message}".strip()
            if failure
            else (outcome.unknown or outcome.transient if outcome else _("not handed over"))
        )
        return _finish(test, error=reason)
    return _finish(test, wamid=outcome.message_id or outcome.reply[:128] or "sent")


def test_send_run(*, test_send_id: int) -> str:
    """Send one recorded test send (claimed first: a second run sends nothing). Returns its status."""
    if not TestSend.objects.filter(pk=test_send_id, status=TestSend.Status.QUEUED).update(
        status=TestSend.Status.SENDING
    ):
        return "claimed elsewhere"
    test = TestSend.objects.select_related(
        "campaign__whatsapp_number__store", "campaign__organization", "campaign__audience_store", "customer"
    ).get(pk=test_send_id)
    if test.campaign.channel == Channel.EMAIL:
        return _email_test_run(test)
    campaign, customer = test.campaign, test.customer
    number = composer.sender_for(campaign, customer) if customer else campaign.whatsapp_number
    if number is None or customer is None:
        return _finish(test, error=_("no number to send from, or the customer is gone"))
    body = template_values(
        customer=customer,
        sources=campaign.template_variables,
        store_name=store_names({number.pk: number}).get(number.pk, ""),
    )
    message = template_message(
        campaign, to=test.to, body=body, links={"r": TEST_LINK, "u": TEST_LINK}, callback=f"t:{test.pk}"
    )
    client = graph_client(number.graph_url or settings.WHATSAPP_GRAPH_URL)
    result = aio.run(
        client.send_template(
            phone_number_id=number.phone_number_id, access_token=number.get_access_token(), message=message
        )
    )
    if result.error is not None:
        return _finish(test, error=str(result.error))
    return _finish(test, wamid=result.wamid)


def _finish(test: TestSend, *, wamid: str = "", error: str = "") -> str:
    status = TestSend.Status.FAILED if error else TestSend.Status.SENT
    TestSend.objects.filter(pk=test.pk).update(
        status=status, wamid=wamid, error=error[:1000], sent_at=timezone.now() if wamid else None
    )
    if error:
        logger.warning("test send %s failed: %s", test.pk, error, extra={"campaign_id": test.campaign_id})
    return str(status)


def test_send_context(campaign: Campaign) -> dict[str, Any]:
    """What the campaign page's "send this campaign to me" box shows: whose variables may be used
    (the first audience customers), whether it may be used now, the last test sends."""
    allowed = campaign.status in (Campaign.Status.DRAFT, Campaign.Status.SCHEDULED)
    customers = list(selectors.campaign_audience(campaign=campaign).order_by("pk")[:20]) if allowed else []
    return {
        "allowed": allowed,
        "customers": customers,
        "recent": list(campaign.test_sends.select_related("customer")[:5]),
        "url": reverse("admin:campaigns_campaign_test_send", args=[campaign.pk]),
    }


def test_send_post(request: HttpRequest, campaign: Campaign) -> HttpResponse:
    """The box's POST: `customer` (an id of the organization's) and `to` (a phone)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    back = reverse("admin:campaigns_campaign_change", args=[campaign.pk])
    customer_id = request.POST.get("customer", "")
    customer = (
        Customer.objects.filter(pk=customer_id, organization_id=campaign.organization_id).first()
        if customer_id.isdigit() and len(customer_id) < 19
        else None
    )
    if customer is None:
        messages.error(request, _("Choose the customer whose variables the test uses."))
        return HttpResponseRedirect(back)
    try:
        test = test_send_request(
            campaign=campaign, customer=customer, to=request.POST.get("to", "")[:64], user_id=request.user.pk
        )
    except lifecycle.CampaignError as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(back)
    messages.success(request, _("Test message to %(to)s queued; its result shows below.") % {"to": test.to})
    return HttpResponseRedirect(back + "#test-send")
