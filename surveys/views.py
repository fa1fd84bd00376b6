"""The public survey page: /s/<signed>. No login, no cookies: the signed token is the credential.

Always in Portuguese, whatever the browser says: the customer got a Portuguese message.
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import translation
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from surveys import links, services
from surveys.forms import SCORES, SurveyForm
from surveys.models import Survey

logger = logging.getLogger(__name__)

LANGUAGE = "pt-br"


def _page(request: HttpRequest, template: str, context: dict[str, Any], status: int = 200) -> HttpResponse:
    with translation.override(LANGUAGE):
        response = render(request, template, context, status=status)
    # LocaleMiddleware only sets the header when it is missing; it would name the browser's language.
    response.headers["Content-Language"] = LANGUAGE
    return response


def _context(survey: Survey, **extra: Any) -> dict[str, Any]:
    return {"organization": survey.organization.name, "store": survey.store.name, **extra}


@never_cache
@csrf_exempt  # the signed token is the credential; a recipient's in-app browser may have no cookies
@require_http_methods(["GET", "HEAD", "POST"])
def survey(request: HttpRequest, signed: str) -> HttpResponse:
    """GET: the form (score 0-10 and a comment). POST: record the answer once, then thank the customer.

    A bad or tampered link is a 404 page; a survey already answered says so instead of the form."""
    found = links.survey_for(signed)
    if found is None:
        return _page(request, "surveys/invalid.html", {}, status=404)
    if found.answered_at is not None:
        return _page(request, "surveys/already_answered.html", _context(found))
    form = SurveyForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        recorded = services.survey_answer(
            survey=found, score=form.cleaned_data["score"], comment=form.cleaned_data["comment"]
        )
        if not recorded:  # a second submission that raced the first
            return _page(request, "surveys/already_answered.html", _context(found))
        logger.info("survey %s answered", found.pk, extra={"organization_id": found.organization_id})
        return _page(request, "surveys/thanks.html", _context(found))
    selected = form.data.get("score") if form.is_bound else None
    return _page(
        request,
        "surveys/survey.html",
        _context(found, form=form, scores=[str(n) for n in SCORES], selected=selected),
    )
