"""What a provider's answer to one send means, decided once for every sender (pure: plain values
in, a Decision out).

A campaign batch, a post-sale survey and every later sender ask the same question of the same
answer; when each decided on its own they drifted (a survey whose WhatsApp request timed out was
retried, and could reach the customer twice, while a campaign's never was). The rules:
- accepted: sent;
- the request went out and no answer came back (a timeout, a connection broken after the write):
  the provider may have accepted it and takes no idempotency key, so it is never resent —
  "outcome unknown", for a late status to settle;
- the provider cannot take it now (throttled), or our own account or number is refused: released
  without spending an attempt, pausing the organization's channel or the number when that is the
  cause;
- worth another try while attempts are left: retried; then failed;
- anything else: failed for good, opting the customer out, stopping the campaign or suppressing
  the address when that is what the provider said.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from integrations.email.bounces import Failure, SmtpFailure
from integrations.whatsapp.client import SendResult
from integrations.whatsapp.errors import Action


class Verdict(StrEnum):
    SENT = "sent"
    UNKNOWN = "unknown"  # may have been accepted: never resent
    RELEASE = "release"  # nothing handed over: back in line, no attempt spent
    RETRY = "retry"  # an attempt spent; another later
    FAIL = "fail"  # for good


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""  # for the message's row (a failure, an unknown outcome, a retry)
    pause_organization: str = ""  # the reason to pause the organization's channel, when set
    pause_number: str = ""  # the reason to pause the sending number, when set
    opt_out: bool = False  # the customer asked the provider to stop (WhatsApp 131050)
    stop_campaign: str = ""  # the reason the campaign (its template) cannot work, when set
    bounce: str = ""  # email: "hard" (the address is suppressed) or "soft" (attempts ran out)
    blocked: bool = False  # email refused by the receiver's policy: counted apart, the address kept


SENT = Decision(Verdict.SENT)


def whatsapp(result: SendResult, *, attempts: int, max_attempts: int) -> Decision:
    """The decision for Meta's answer to a send that has used `attempts` of `max_attempts`."""
    if result.ok:
        return SENT
    error = result.error
    assert error is not None
    details = f" — {error.details}" if error.details else ""
    reason = (error.message + details)[:2000]
    action = result.action
    if result.maybe_accepted and action == Action.RETRY:
        return Decision(Verdict.UNKNOWN, f"outcome unknown: {error.message}; not resent")
    if action == Action.THROTTLED:
        return Decision(Verdict.RELEASE, reason)
    if action == Action.STOP_ORGANIZATION:
        return Decision(Verdict.RELEASE, reason, pause_organization=str(error))
    if action == Action.PAUSE_NUMBER:
        return Decision(Verdict.RELEASE, reason, pause_number=str(error))
    if action == Action.RETRY and attempts < max_attempts:
        return Decision(Verdict.RETRY, reason)
    return Decision(
        Verdict.FAIL,
        reason,
        opt_out=action == Action.OPT_OUT,
        stop_campaign=str(error) if action == Action.STOP_CAMPAIGN else "",
    )


def describe(failure: SmtpFailure) -> str:
    """An SMTP failure as one line: code, enhanced code, text (at most 2,000 characters)."""
    parts = [str(failure.code) if failure.code else "", failure.enhanced or "", failure.message]
    return " ".join(p for p in parts if p)[:2000]


class EmailAnswer(Protocol):
    """What a mail server or ESP answered to one hand-over: `unknown` when the connection broke
    after it, `transient` when the ESP could not take it (429, 5xx, unreachable), else the server's
    refusal (`failure`) or none (accepted)."""

    failure: SmtpFailure | None
    unknown: str
    transient: str


def email(answer: EmailAnswer, *, attempts: int, max_attempts: int) -> Decision:
    """The decision for an email hand-over that has used `attempts` of `max_attempts`."""
    if answer.unknown:
        return Decision(Verdict.UNKNOWN, answer.unknown)
    if answer.transient:
        return Decision(Verdict.RELEASE, f"email provider unavailable: {answer.transient}")
    failure = answer.failure
    if failure is None:
        return SENT
    text = describe(failure)
    if failure.kind is Failure.SENDER:
        # Our side is broken (login, relay, TLS): the customer is left alone until it is fixed.
        return Decision(Verdict.RELEASE, text, pause_organization=text)
    if failure.kind is Failure.BLOCKED:
        return Decision(Verdict.FAIL, text, blocked=True)
    if failure.kind is Failure.SOFT_BOUNCE and attempts < max_attempts:
        return Decision(Verdict.RETRY, text, bounce="soft")
    return Decision(Verdict.FAIL, text, bounce="hard" if failure.kind is Failure.HARD_BOUNCE else "soft")
