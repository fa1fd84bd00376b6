"""Meta's answers into a `BatchPlan`, pure: what each message becomes and what the batch does next."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal

from campaigns import lifecycle
from campaigns.models import WhatsappMessage
from integrations.whatsapp.client import SendResult
from integrations.whatsapp.phones import phone_region
from messaging import decisions
from messaging.decisions import Verdict

Status = WhatsappMessage.Status

ATTEMPTS = 2  # the seed: 2 attempts, exponential backoff from 1 s
RETRY_BACKOFF = 1.0
THROTTLE_DELAY = 5.0
PAUSED_DELAY = lifecycle.PAUSED_DELAY

# A message Meta accepted that its status webhook has already moved on (it was counted as sent there).
_WEBHOOK_SETTLED = (Status.SENT, Status.DELIVERED, Status.READ)

# --- Classify into a plan (pure) -----------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """Meta's answer for one message, with what the plan needs to know of the message."""

    message_id: int
    customer_id: int
    number_id: int  # the number it went from
    attempts: int  # the message's attempts, this one included
    phone: str  # E.164
    result: SendResult


@dataclass(frozen=True)
class Accepted:
    """A message Meta accepted: what is written on it."""

    wamid: str
    wa_id: str
    cost: Decimal | None  # None: its row keeps the cost its status webhook recorded


@dataclass(frozen=True)
class Refused:
    """A message that failed for good: Meta's code and what it said."""

    code: int | None
    reason: str


@dataclass
class BatchPlan:
    """What a batch's outcomes call for, by message id (each in one group at most), and for the
    customers, the organization and its numbers."""

    sent: dict[int, Accepted] = field(default_factory=dict)
    failed: dict[int, Refused] = field(default_factory=dict)
    unknown: dict[int, str] = field(default_factory=dict)  # Meta may have accepted it: never resent
    skipped: dict[int, str] = field(default_factory=dict)
    retry: list[int] = field(default_factory=list)  # back to QUEUED for another attempt
    release: list[int] = field(default_factory=list)  # back to QUEUED, the attempt given back
    # Accepted, but its status webhook moved it on first (and counted it as sent): only what the
    # send alone knows (wa_id, phone, the cost not yet counted) is written. Set by `reconciled`.
    settled: dict[int, Accepted] = field(default_factory=dict)
    opt_out: list[int] = field(default_factory=list)  # customers who stopped marketing (Meta 131050)
    stop_campaign: str = ""  # the template itself is broken: why
    pause_organization: str = ""  # the business account is unusable: why
    pause_numbers: dict[int, str] = field(default_factory=dict)  # number id -> why Meta refused it
    retry_after: float = 0.0  # the longest Retry-After Meta (or a proxy in front of it) asked for

    @property
    def cost(self) -> Decimal:
        """What the messages written as sent cost, not counted yet."""
        accepted = [*self.sent.values(), *self.settled.values()]
        return sum((a.cost for a in accepted if a.cost is not None), Decimal("0"))

    @property
    def delay(self) -> float | None:
        """How long the batch waits before its next run, None when nothing waits: a paused account
        or number longest, then a throttle, then a retry, never sooner than Meta asked."""
        if self.pause_organization or self.pause_numbers:
            return PAUSED_DELAY * 2
        if self.release:
            return max(THROTTLE_DELAY, self.retry_after)
        if self.retry:
            return max(RETRY_BACKOFF, self.retry_after)
        return None

    @property
    def counts(self) -> dict[str, int]:
        return {
            "sent": len(self.sent),
            "failed": len(self.failed),
            "unknown": len(self.unknown),
            "skipped": len(self.skipped),
            "retry": len(self.retry),
            "throttled": len(self.release),
        }

    def reconciled(self, current: dict[int, str], priced: set[int]) -> BatchPlan:
        """The plan over the rows as they are now (`current`: status by id; `priced`: the ids whose
        row holds a cost). A status webhook may have settled some while the batch was in flight
        (Meta answers statuses fast, a paced batch takes seconds): only rows still SENDING are
        written, so a delivered/read is never undone nor a send counted twice, and an accepted one
        the webhook moved on is `settled`, keeping the cost the webhook counted. The customers',
        organization's and numbers' part stands as it is."""
        pending = {pk for pk, status in current.items() if status == Status.SENDING}
        settled = {
            pk: replace(a, cost=None) if pk in priced else a
            for pk, a in self.sent.items()
            if current.get(pk) in _WEBHOOK_SETTLED
        }
        return replace(
            self,
            sent={pk: a for pk, a in self.sent.items() if pk in pending},
            failed={pk: r for pk, r in self.failed.items() if pk in pending},
            unknown={pk: r for pk, r in self.unknown.items() if pk in pending},
            skipped={pk: r for pk, r in self.skipped.items() if pk in pending},
            retry=[pk for pk in self.retry if pk in pending],
            release=[pk for pk in self.release if pk in pending],
            settled=settled,
        )


def batch_classify(
    outcomes: list[Outcome], *, skipped: dict[int, str], prices: dict[str, Decimal]
) -> BatchPlan:
    """The plan for Meta's answers, and for the messages skipped before any send (id -> reason).
    Pure: plain values in, the plan out. A sent message costs its country's price on `prices` (the
    template category's rate card), else the "*" one, else 0."""
    plan = BatchPlan(skipped=dict(skipped))
    for o in outcomes:
        r = o.result
        if r.ok:
            cost = prices.get(phone_region(o.phone), prices.get("*", Decimal("0")))
            plan.sent[o.message_id] = Accepted(wamid=r.wamid, wa_id=r.wa_id, cost=cost)
        else:
            _classify_refusal(plan, o)
    return plan


def _classify_refusal(plan: BatchPlan, o: Outcome) -> None:
    """Meta's error, as every sender decides it (messaging.decisions.whatsapp), into the plan. An
    unknown outcome is never resent and never "failed": a late status webhook settles it
    (campaigns.statuses)."""
    r = o.result
    assert r.error is not None
    plan.retry_after = max(plan.retry_after, r.retry_after or 0.0)
    decision = decisions.whatsapp(r, attempts=o.attempts, max_attempts=ATTEMPTS)
    if decision.verdict is Verdict.UNKNOWN:
        plan.unknown[o.message_id] = decision.reason
    elif decision.verdict is Verdict.RELEASE:
        plan.release.append(o.message_id)
        if decision.pause_organization:
            plan.pause_organization = decision.pause_organization
        if decision.pause_number:
            plan.pause_numbers[o.number_id] = decision.pause_number
    elif decision.verdict is Verdict.RETRY:
        plan.retry.append(o.message_id)
    else:
        if decision.opt_out:
            plan.opt_out.append(o.customer_id)
        if decision.stop_campaign:
            plan.stop_campaign = decision.stop_campaign
        plan.failed[o.message_id] = Refused(code=r.error.code, reason=decision.reason)
