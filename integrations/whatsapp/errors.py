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
    STOP_ORGANIZATION = "stop_organization"  # credentials/account: stop all of the organization's sends


_BY_CODE: dict[int, Action] = {
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
    190: Action.STOP_ORGANIZATION,  # access token expired/invalid
    131031: Action.STOP_ORGANIZATION,  # business account locked
    131042: Action.STOP_ORGANIZATION,  # payment issue
    368: Action.STOP_ORGANIZATION,  # temporarily blocked for policy violations
    131048: Action.STOP_ORGANIZATION,  # spam rate limit hit
}


def classify(*, code: int | None, status: int | None, timeout: bool = False) -> Action:
    """The action for an error: by Graph code first, then what integrations.retry retries (timeouts,
    408/425/429, 5xx), anything else drops."""
    if timeout:
        return Action.RETRY
    if code is not None and code in _BY_CODE:
        return _BY_CODE[code]
    if status is not None and retry.for_status(status).retryable:
        return Action.RETRY
    if code in (1, 2):  # Graph's "unknown"/"service unavailable"
        return Action.RETRY
    return Action.DROP_RECIPIENT
