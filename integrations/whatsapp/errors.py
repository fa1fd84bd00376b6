"""What to do with each Meta Graph error code (pure: codes in, a decision out)."""

from __future__ import annotations

from enum import StrEnum

from integrations import retry


class Action(StrEnum):
    RETRY = "retry"  # try again soon, spending an attempt
    THROTTLED = "throttled"  # try again later without spending an attempt (rate limits)
    DROP_RECIPIENT = "drop_recipient"  # never retry this recipient
    OPT_OUT = "opt_out"  # never retry, and record the customer's opt-out
    STOP_CAMPAIGN = "stop_campaign"  # the template/campaign itself is broken
    # The business account itself (locked, unpaid, restricted): stop all of the organization's sends.
    STOP_ORGANIZATION = "stop_organization"
    # One sending number (its token, registration, display name, quality): stop that number's sends only.
    PAUSE_NUMBER = "pause_number"


# Every Graph error code this sender knows (public: the admin's error-code filter lists them).
BY_CODE: dict[int, Action] = {
    4: Action.THROTTLED,  # application request limit reached
    80007: Action.THROTTLED,  # WABA rate limit
    130429: Action.THROTTLED,  # cloud API throughput reached
    131056: Action.RETRY,  # pair rate limit (same sender/recipient too fast)
    131026: Action.DROP_RECIPIENT,  # message undeliverable
    131050: Action.OPT_OUT,  # user stopped marketing messages
    130472: Action.DROP_RECIPIENT,  # user's number is part of an experiment
    131008: Action.STOP_CAMPAIGN,  # required parameter missing
    132000: Action.STOP_CAMPAIGN,  # template param count mismatch
    132001: Action.STOP_CAMPAIGN,  # template does not exist
    132012: Action.STOP_CAMPAIGN,  # template parameter format mismatch
    # One recipient's values, not the campaign: a parameter with a new-line, a tab or more than 4
    # spaces in a row (integrations.whatsapp.parameters folds them first, so this is a value that
    # still got through), and a text too long once the values are in. That message fails; the rest go.
    132018: Action.DROP_RECIPIENT,
    132005: Action.DROP_RECIPIENT,
    # Meta's error codes reference (developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes)
    # says which object each one is about. The WhatsApp Business Account (WABA) and its payment
    # method are shared by all of an organization's numbers:
    131031: Action.STOP_ORGANIZATION,  # business account locked (restricted or disabled)
    131042: Action.STOP_ORGANIZATION,  # business eligibility: payment method issue
    368: Action.STOP_ORGANIZATION,  # WABA temporarily blocked for policy violations
    # One phone number: its access token is stored per number (WhatsappNumber), so a token error names
    # the number whose token to replace; the others, and the number's quality, are the number's own.
    0: Action.PAUSE_NUMBER,  # AuthException
    3: Action.PAUSE_NUMBER,  # capability or permissions issue of the token
    10: Action.PAUSE_NUMBER,  # permission denied
    190: Action.PAUSE_NUMBER,  # access token expired/invalid
    33: Action.PAUSE_NUMBER,  # the business phone number has been deleted
    131037: Action.PAUSE_NUMBER,  # the number needs display name approval before it can send
    131045: Action.PAUSE_NUMBER,  # incorrect certificate (registration)
    131048: Action.PAUSE_NUMBER,  # spam rate limit: restrictions on messages from this phone number
    133010: Action.PAUSE_NUMBER,  # phone number not registered on the platform
}
_PERMISSION_CODES = range(200, 300)  # Graph's API permission errors (of the number's token)


def classify(*, code: int | None, status: int | None, timeout: bool = False) -> Action:
    """The action for an error: by Graph code first, then what integrations.retry retries (timeouts,
    408/425/429, 5xx), anything else drops."""
    if timeout:
        return Action.RETRY
    if code is not None and code in BY_CODE:
        return BY_CODE[code]
    if code in _PERMISSION_CODES:
        return Action.PAUSE_NUMBER
    if status is not None and retry.for_status(status).retryable:
        return Action.RETRY
    if code in (1, 2):  # Graph's "unknown"/"service unavailable"
        return Action.RETRY
    return Action.DROP_RECIPIENT
