"""Public endpoints behind WhatsApp buttons: /r/<signed> (tracked redirect) and /u/<signed> (unsubscribe).

No login, no cookies: the signed token is the credential. Pages are always in Portuguese, since the
recipient's browser language says nothing about the language of the message they received.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils import translation
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_safe

from campaigns import links

logger = logging.getLogger(__name__)

LANGUAGE = "pt-br"


def _page(request: HttpRequest, template: str, status: int = 200) -> HttpResponse:
    with translation.override(LANGUAGE):
        response = render(request, template, status=status)
    # LocaleMiddleware only sets the header when it is missing; it would name the browser's language.
    response.headers["Content-Language"] = LANGUAGE
    return response


def _invalid(request: HttpRequest) -> HttpResponse:
    return _page(request, "campaigns/link_invalid.html", status=404)


@never_cache
@require_safe
def redirect(request: HttpRequest, signed: str) -> HttpResponse:
    """302 to the campaign's configured URL, counting the message's first click; 404 for a bad link."""
    message = links.message_for(signed)
    if message is None or not message.campaign.redirect_url:
        return _invalid(request)
    # HEAD comes from link-preview bots, not from a person tapping the button.
    if request.method == "GET":
        links.message_click(message=message)
    # The target comes from the campaign row, never from the request: no open redirect.
    return HttpResponseRedirect(message.campaign.redirect_url)


@never_cache
@csrf_exempt  # authenticated by the signed token; the recipient's in-app browser may have no cookies
@require_http_methods(["GET", "HEAD", "POST"])
def unsubscribe(request: HttpRequest, signed: str) -> HttpResponse:
    """GET: a confirmation form (changes nothing). POST: opt the customer out, then the done page (200)."""
    message = links.message_for(signed)
    if message is None:
        return _invalid(request)
    if request.method == "POST":
        if links.message_unsubscribe(message=message):
            logger.info(
                "customer %s opted out of WhatsApp through campaign %s",
                message.customer_id,
                message.campaign_id,
                extra={"organization_id": message.organization_id, "campaign_id": message.campaign_id},
            )
        return _page(request, "campaigns/unsubscribe_done.html")
    if message.customer.whatsapp_opted_out_at is not None:
        # Already out (earlier link, reply, provider): asking again would suggest they still get messages.
        return _page(request, "campaigns/unsubscribe_done.html")
    return _page(request, "campaigns/unsubscribe_confirm.html")
