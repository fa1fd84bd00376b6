"""One decision for every sender: whatever Meta or a mail server answers, a campaign batch writes
the message the way `messaging.decisions` decided — the same decision a post-sale survey applies
(surveys call it directly; tests/surveys has the end-to-end cases, the timed-out send among them).
Pure: answers in, plans out, no database."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from campaigns.email.sending import ATTEMPTS as EMAIL_ATTEMPTS
from campaigns.email.sending import chunk_classify
from campaigns.models import EmailMessage
from campaigns.whatsapp.plan import ATTEMPTS, Outcome, batch_classify
from integrations.email.bounces import Failure, SmtpFailure
from integrations.errors import IntegrationError
from integrations.whatsapp.client import SendResult
from integrations.whatsapp.errors import BY_CODE, classify
from messaging import decisions
from messaging.decisions import Verdict
from messaging.email_transport import Delivery

CODES = st.one_of(st.none(), st.sampled_from(sorted(BY_CODE)), st.integers(-5, 140_000))
STATUSES = st.one_of(st.none(), st.sampled_from([200, 400, 401, 403, 404, 408, 425, 429, 500, 502, 503]))


@st.composite
def meta_answers(draw: st.DrawFn) -> SendResult:
    if draw(st.booleans()):
        return SendResult(wamid="wamid.1", wa_id="5511999990001")
    code, status, timeout = draw(CODES), draw(STATUSES), draw(st.booleans())
    maybe = draw(st.booleans())
    error = IntegrationError(
        draw(st.text(max_size=50)),
        retryable=draw(st.booleans()),
        code=code,
        status=status,
        details=draw(st.text(max_size=20)),
        maybe_delivered=maybe,
    )
    return SendResult(
        error=error,
        action=classify(code=code, status=status, timeout=timeout),
        maybe_accepted=maybe,
        retry_after=draw(st.one_of(st.none(), st.floats(0, 60))),
    )


@given(result=meta_answers(), attempts=st.integers(1, ATTEMPTS))
def test_a_campaign_batch_writes_each_whatsapp_answer_as_decided(result: SendResult, attempts: int) -> None:
    decision = decisions.whatsapp(result, attempts=attempts, max_attempts=ATTEMPTS)
    outcome = Outcome(
        message_id=1, customer_id=2, number_id=3, attempts=attempts, phone="+5511999990001", result=result
    )
    plan = batch_classify([outcome], skipped={}, prices={})
    where = {
        Verdict.SENT: 1 in plan.sent,
        Verdict.UNKNOWN: 1 in plan.unknown,
        Verdict.RELEASE: 1 in plan.release,
        Verdict.RETRY: 1 in plan.retry,
        Verdict.FAIL: 1 in plan.failed,
    }
    assert [v for v, held in where.items() if held] == [decision.verdict]  # in one group, the decided one
    assert (2 in plan.opt_out) == decision.opt_out
    assert plan.stop_campaign == decision.stop_campaign
    assert plan.pause_organization == decision.pause_organization
    assert plan.pause_numbers.get(3, "") == decision.pause_number


@given(result=meta_answers(), attempts=st.integers(1, ATTEMPTS))
def test_a_request_that_may_have_been_accepted_is_never_sent_again(result: SendResult, attempts: int) -> None:
    decision = decisions.whatsapp(result, attempts=attempts, max_attempts=ATTEMPTS)
    if result.maybe_accepted and not result.ok:
        assert decision.verdict in (Verdict.UNKNOWN, Verdict.FAIL, Verdict.RELEASE)
        assert decision.verdict is not Verdict.RETRY
    if decision.verdict is Verdict.RETRY:
        assert attempts < ATTEMPTS and not result.maybe_accepted


FAILURES = st.builds(
    SmtpFailure,
    kind=st.sampled_from(list(Failure)),
    code=st.one_of(st.none(), st.integers(400, 599)),
    enhanced=st.one_of(st.none(), st.just("5.1.1")),
    message=st.text(max_size=40),
)


@st.composite
def email_answers(draw: st.DrawFn) -> Delivery:
    which = draw(st.sampled_from(["sent", "unknown", "transient", "failure"]))
    if which == "sent":
        return Delivery(reply="250 ok")
    if which == "unknown":
        return Delivery(unknown=draw(st.text(min_size=1, max_size=20)))
    if which == "transient":
        return Delivery(transient=draw(st.text(min_size=1, max_size=20)))
    return Delivery(failure=draw(FAILURES))


@given(outcome=email_answers(), attempts=st.integers(1, EMAIL_ATTEMPTS))
def test_a_campaign_chunk_writes_each_email_answer_as_decided(outcome: Delivery, attempts: int) -> None:
    decision = decisions.email(outcome, attempts=attempts, max_attempts=EMAIL_ATTEMPTS)
    message = EmailMessage(pk=1, email="Ana@Example.com", attempts=attempts)
    plan = chunk_classify([message], [outcome], now=datetime(2026, 1, 1, tzinfo=UTC))
    where = {
        Verdict.SENT: plan.sent,
        Verdict.UNKNOWN: plan.failed,
        Verdict.RETRY: plan.retry,
    }
    if decision.verdict is Verdict.RELEASE:
        assert plan.release == [1]
        assert plan.sender_failure == decision.pause_organization
    elif decision.verdict is Verdict.FAIL:
        assert (plan.blocked if decision.blocked else plan.bounced) == [message]
        assert bool(plan.suppress) == (decision.bounce == "hard")
    else:
        assert where[decision.verdict] == [message]


def test_the_decisions_name_what_to_pause_and_why() -> None:
    refused = IntegrationError("token expired", retryable=False, code=190, status=401)
    decision = decisions.whatsapp(
        SendResult(error=refused, action=classify(code=190, status=401)), attempts=1, max_attempts=ATTEMPTS
    )
    assert decision.verdict is Verdict.RELEASE and decision.pause_number and not decision.pause_organization
    assert decisions.whatsapp(SendResult(wamid="w"), attempts=1, max_attempts=1) == decisions.SENT
