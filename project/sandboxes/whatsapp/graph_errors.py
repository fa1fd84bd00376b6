"""Graph's errors as the sandbox answers them: Meta's codes and wording, the JSON shape and status."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from typing import Any

from aiohttp import web

RATE_LIMIT_CODES = frozenset({4, 80007, 130429, 131056})


ERROR_DOCS = "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/"

# Graph error code -> (message title, details), as Meta words them.
ERRORS: dict[int, tuple[str, str]] = {
    1: ("An unknown error occurred", "Invalid request or possible server error."),
    2: ("Service temporarily unavailable", "Temporary due to downtime or due to being overloaded."),
    4: ("Application request limit reached", "The app has reached its API call rate limit."),
    100: ("Invalid parameter", "The request included one or more unsupported or misspelled parameters."),
    190: ("Invalid OAuth access token - Cannot parse access token", ""),
    368: (
        "Temporarily blocked for policies violations",
        "The WhatsApp Business Account associated with the app has been restricted or disabled "
        "for violating a platform policy.",
    ),
    2500: ("Unknown path components", "The request path is not a known Graph API endpoint."),
    80007: ("Rate limit issues", "The WhatsApp Business Account has reached its rate limit."),
    130429: ("Rate limit hit", "Cloud API message throughput has been reached."),
    130472: (
        "User's number is part of an experiment",
        "Failed to send message because this user's phone number is part of an experiment.",
    ),
    131000: ("Something went wrong", "Message failed to send due to an unknown error."),
    132005: ("Template Hydrated Text Too Long", "Translated text is too long."),
    131008: ("Required parameter is missing", "The request is missing a required parameter."),
    131026: (
        "Message undeliverable",
        "Unable to deliver message. Reasons can include: the recipient phone number is not a WhatsApp "
        "phone number; the recipient has not accepted the new Terms of Service and Privacy Policy; "
        "the recipient is using an old WhatsApp version.",
    ),
    131031: (
        "Account has been locked",
        "The WhatsApp Business Account is restricted or disabled for violating a platform policy, "
        "or the data in the request could not be verified.",
    ),
    131042: (
        "Business eligibility payment issue",
        "There was an error related to your payment method.",
    ),
    131047: (
        "Re-engagement message",
        "More than 24 hours have passed since the recipient last replied to the sender number.",
    ),
    131048: (
        "Spam rate limit hit",
        "Message failed to send because there are restrictions on how many messages can be sent from "
        "this phone number.",
    ),
    131049: (
        "This message was not delivered to maintain healthy ecosystem engagement.",
        "In order to maintain a healthy ecosystem engagement, the message failed to be delivered.",
    ),
    131050: (
        "User has stopped marketing messages",
        "Unable to deliver the message. This recipient has chosen to stop receiving marketing messages "
        "on WhatsApp from your business.",
    ),
    131056: (
        "(Business Account, Consumer Account) pair rate limit hit",
        "Too many messages sent from the sender phone number to the same recipient phone number in a "
        "short period of time.",
    ),
    132000: (
        "Number of parameters does not match the expected number of params",
        "The number of variable parameter values included in the request did not match the number of "
        "variable parameters defined in the template.",
    ),
    132001: (
        "Template name does not exist in the translation",
        "The template does not exist in the specified language or the template has not been approved.",
    ),
    132012: (
        "Parameter format does not match format in the created template",
        "Variable parameter values formatted incorrectly.",
    ),
    132018: (
        "There's an issue with the parameters in your template",
        "Param text cannot have new-line/tab characters or more than 4 consecutive spaces",
    ),
}


def _fbtrace_id() -> str:
    """A random 23-character id shaped like Graph's ``fbtrace_id``."""
    return base64.urlsafe_b64encode(os.urandom(18)).decode()[:23]


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def _json_response(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=_dumps(payload), status=status, content_type="application/json", headers=headers)


def default_http_status(code: int) -> int:
    """The HTTP status Graph answers an error ``code`` with (429 for rate limits, 401 for tokens...)."""
    if code in RATE_LIMIT_CODES:
        return 429
    if code == 190:
        return 401
    if code in (1, 2):
        return 500
    return 400


class GraphError(Exception):
    """A Graph API error; :meth:`response` renders it exactly as Meta does."""

    def __init__(
        self,
        code: int,
        details: str | None = None,
        *,
        http_status: int | None = None,
        message: str | None = None,
        error_subcode: int | None = None,
        retry_after: int | None = None,
    ) -> None:
        title, default_details = ERRORS.get(code, ("Unknown error", "The request could not be processed."))
        self.code = code
        self.http_status = http_status or default_http_status(code)
        # Graph prefixes most messages with the code; token errors (190) and the generic 1/2 have none.
        self.message = message or (title if code in (1, 2, 190) else f"(#{code}) {title}")
        self.details = default_details if details is None else details
        self.error_subcode = error_subcode
        self.retry_after = retry_after
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        """The ``{"error": {...}}`` document, with a fresh ``fbtrace_id``."""
        error: dict[str, Any] = {"message": self.message, "type": "OAuthException", "code": self.code}
        if self.error_subcode is not None:
            error["error_subcode"] = self.error_subcode
        if self.code != 190:
            error["error_data"] = {"messaging_product": "whatsapp", "details": self.details}
        error["fbtrace_id"] = _fbtrace_id()
        return {"error": error}

    def response(self) -> web.Response:
        """The HTTP response Graph would send for this error."""
        body = self.body()
        headers = {"x-fb-trace-id": body["error"]["fbtrace_id"]}
        if self.code == 190:
            headers["WWW-Authenticate"] = f'OAuth "Facebook Platform" "invalid_token" "{self.message}"'
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return _json_response(body, status=self.http_status, headers=headers)
