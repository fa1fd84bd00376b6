"""Public endpoints behind campaign links: /r/<signed>[/<n>] (tracked redirect), /u/<signed>
(unsubscribe, also the RFC 8058 one-click target of emails) and /o/<signed> (an email's open pixel).

No login, no cookies: the signed token is the credential. Pages are always in Portuguese, since the
recipient's browser language says nothing about the language of the message they received.
"""

from __future__ import annotations

import base64
import logging

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils import translation
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_safe

from campaigns import links
from campaigns.models import EmailMessage

logger = logging.getLogger(__name__)

LANGUAGE = "pt-br"


# The smallest transparent GIF (1x1, 43 bytes).
PIXEL = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")


def _page(
    request: HttpRequest, template: str, status: int = 200, context: dict[str, str] | None = None
) -> HttpResponse:
    with translation.override(LANGUAGE):
        response = render(request, template, context, status=status)
    # LocaleMiddleware only sets the header when it is missing; it would name the browser's language.
    response.headers["Content-Language"] = LANGUAGE
    return response


def _invalid(request: HttpRequest) -> HttpResponse:
    return _page(request, "campaigns/link_invalid.html", status=404)


@never_cache
@require_safe
def redirect(request: HttpRequest, signed: str, index: int | None = None) -> HttpResponse:
    """302 to the campaign's URL, counting the message's first click; 404 for a bad link.

    A WhatsApp button has one target (the campaign's redirect URL); an email's link n is the n-th
    tracked link of its body. The target is the one frozen when the campaign started, never from the
    request: no open redirect, and no later edit moves a link someone already received."""
    message = links.message_for("r", signed)
    if message is None:
        return _invalid(request)
    target = links.message_target(message, index)
    if not target:
        return _invalid(request)
    # HEAD comes from link-preview bots, not from a person tapping the button.
    if request.method == "GET":
        links.message_click(message=message)
    return HttpResponseRedirect(target)


@never_cache
@require_safe
def open_pixel(request: HttpRequest, signed: str) -> HttpResponse:
    """A 1x1 GIF; a GET counts the email's first open. Always the image, so nothing leaks."""
    message = links.message_for("o", signed)
    if request.method == "GET" and isinstance(message, EmailMessage):
        links.message_open(message=message)
    return HttpResponse(PIXEL, content_type="image/gif")


@never_cache
@csrf_exempt  # authenticated by the signed token; the recipient's in-app browser may have no cookies
@require_http_methods(["GET", "HEAD", "POST"])
def unsubscribe(request: HttpRequest, signed: str) -> HttpResponse:
    """GET: a confirmation form (changes nothing). POST: opt the customer out, then the done page (200).

    The POST is also RFC 8058's one-click unsubscribe (a mail client posts
    "List-Unsubscribe=One-Click" with no cookies): it is answered 200, never redirected."""
    message = links.message_for("u", signed)
    if message is None:
        return _invalid(request)
    context = {"channel": message.campaign.channel}
    if request.method == "POST":
        if links.message_unsubscribe(message=message):
            logger.info(
                "customer %s opted out of %s through campaign %s",
                message.customer_id,
                message.campaign.channel,
                message.campaign_id,
                extra={"organization_id": message.organization_id, "campaign_id": message.campaign_id},
            )
        return _page(request, "campaigns/unsubscribe_done.html", context=context)
    if links.opted_out(message):
        # Already out (earlier link, reply, provider): asking again would suggest they still get messages.
        return _page(request, "campaigns/unsubscribe_done.html", context=context)
    return _page(request, "campaigns/unsubscribe_confirm.html", context=context)
