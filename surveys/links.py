"""Signed survey links: `s/<token>.<signature>` on our own host.

The survey's random token is signed with SECRET_KEY, so a made-up or tampered link is rejected by
an HMAC check before the database is asked anything.
"""

from __future__ import annotations

from django.conf import settings
from django.core import signing

from surveys.models import Survey

PREFIX = "s"


def _signer() -> signing.Signer:
    # "." never appears in a token_urlsafe value nor in the base64url signature: no escaping needed
    # in a WhatsApp button's URL suffix. Built per call so a rotated SECRET_KEY is honoured.
    return signing.Signer(salt="surveys.survey", sep=".")


def survey_path(survey: Survey) -> str:
    """The survey page's path without the leading slash ("s/<signed>"), e.g. a WhatsApp button's suffix."""
    return f"{PREFIX}/{_signer().sign(survey.token)}"


def survey_url(survey: Survey) -> str:
    """The absolute URL of the survey page on this deployment's PUBLIC_URL (for emails)."""
    return f"{settings.PUBLIC_URL}/{survey_path(survey)}"


def survey_for(signed: str) -> Survey | None:
    """The survey a signed token names, with its organization and store; None when the signature is
    wrong (no query is made then) or no survey has that token."""
    try:
        token = _signer().unsign(signed)
    except signing.BadSignature:
        return None
    return Survey.objects.select_related("organization", "store", "customer").filter(token=token).first()
