"""chunk_classify, the pure step of an email chunk: outcomes in, a plan of writes out, no database."""

from __future__ import annotations

from datetime import UTC, datetime

from campaigns.email.sending import ATTEMPTS, chunk_classify
from campaigns.models import OUTCOME_UNKNOWN, BounceType, EmailMessage
from integrations.email.bounces import Failure, SmtpFailure
from messaging.email_transport import Delivery

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _message(pk: int, *, attempts: int = 1) -> EmailMessage:
    return EmailMessage(id=pk, attempts=attempts, email=f"Person{pk}@Example.com")


def _refused(kind: Failure, code: int = 550) -> Delivery:
    return Delivery(failure=SmtpFailure(kind=kind, code=code, enhanced="5.1.1", message="no"))


def test_a_sent_message_is_marked_sent_with_its_reply_and_esp_id():
    m = _message(1)
    plan = chunk_classify([m], [Delivery(reply="250 ok", message_id="esp-1")], now=NOW)
    assert plan.sent == [m]
    assert (m.status, m.smtp_reply, m.sent_at, m.esp_message_id) == (
        EmailMessage.Status.SENT,
        "250 ok",
        NOW,
        "esp-1",
    )
    assert not (plan.bounced or plan.failed or plan.release or plan.suppress or plan.retry)


def test_a_hard_bounce_suppresses_the_address_and_a_block_does_not():
    hard, blocked = _message(1), _message(2)
    plan = chunk_classify(
        [hard, blocked], [_refused(Failure.HARD_BOUNCE), _refused(Failure.BLOCKED)], now=NOW
    )
    assert plan.bounced == [hard] and hard.bounce_type == BounceType.HARD and hard.failed_at == NOW
    assert plan.blocked == [blocked] and blocked.failed_at == NOW
    assert plan.suppress == [("person1@example.com", "550 5.1.1 no")]


def test_a_soft_bounce_retries_until_the_last_attempt():
    early, last = _message(1, attempts=1), _message(2, attempts=ATTEMPTS)
    plan = chunk_classify(
        [early, last], [_refused(Failure.SOFT_BOUNCE, 450), _refused(Failure.SOFT_BOUNCE, 450)], now=NOW
    )
    assert plan.retry == [early]
    assert plan.bounced == [last] and last.bounce_type == BounceType.SOFT
    assert plan.suppress == []


def test_a_sender_failure_releases_the_message_and_names_the_cause():
    m, not_sent = _message(1), _message(2)
    plan = chunk_classify([m, not_sent], [_refused(Failure.SENDER, 535), None], now=NOW)
    assert plan.release == [1, 2]
    assert plan.sender_failure == "535 5.1.1 no"
    assert not (plan.sent or plan.bounced or plan.failed)


def test_an_unknown_outcome_fails_the_message_and_a_busy_esp_releases_it():
    unknown, busy = _message(1), _message(2)
    plan = chunk_classify(
        [unknown, busy], [Delivery(unknown="connection lost"), Delivery(transient="429")], now=NOW
    )
    assert plan.failed == [unknown] and unknown.error_reason == OUTCOME_UNKNOWN
    assert plan.release == [2] and plan.transient == "429"


def test_a_busy_esp_s_longest_retry_after_is_what_the_batch_waits_for():
    first, second, third = _message(1), _message(2), _message(3)
    plan = chunk_classify(
        [first, second, third],
        [
            Delivery(transient="429", retry_after=30.0),
            Delivery(transient="429", retry_after=90.0),
            Delivery(transient="503"),  # no Retry-After
        ],
        now=NOW,
    )
    assert plan.release == [1, 2, 3] and plan.retry_after == 90.0
    assert chunk_classify([_message(4)], [Delivery(transient="503")], now=NOW).retry_after == 0.0
