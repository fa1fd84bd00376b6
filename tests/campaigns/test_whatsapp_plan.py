"""batch_classify and BatchPlan, the pure steps of a WhatsApp batch: Meta's answers in, a plan of
writes out, no database."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from campaigns.models import WhatsappMessage
from campaigns.whatsapp.plan import (
    ATTEMPTS,
    PAUSED_DELAY,
    RETRY_BACKOFF,
    THROTTLE_DELAY,
    Accepted,
    BatchPlan,
    Outcome,
    Refused,
    batch_classify,
)
from integrations.errors import IntegrationError
from integrations.whatsapp.client import SendResult
from integrations.whatsapp.errors import Action

Status = WhatsappMessage.Status
BR_PHONE = "+5511999990001"
US_PHONE = "+12025550123"
PRICES = {"BR": Decimal("0.0625"), "*": Decimal("0.0700")}


def _outcome(
    pk: int, result: SendResult, *, attempts: int = 1, number: int = 7, phone: str = BR_PHONE
) -> Outcome:
    return Outcome(
        message_id=pk, customer_id=100 + pk, number_id=number, attempts=attempts, phone=phone, result=result
    )


def _accepted(pk: int) -> SendResult:
    return SendResult(wamid=f"wamid.{pk}", wa_id=f"55119999900{pk:02d}")


def _refused(
    action: Action,
    code: int = 131000,
    *,
    maybe_accepted: bool = False,
    retry_after: float | None = None,
    details: str = "",
) -> SendResult:
    error = IntegrationError("refused", retryable=False, code=code, details=details)
    return SendResult(error=error, action=action, maybe_accepted=maybe_accepted, retry_after=retry_after)


def test_an_accepted_message_is_sent_at_its_country_s_price_else_the_default_one():
    plan = batch_classify(
        [_outcome(1, _accepted(1)), _outcome(2, _accepted(2), phone=US_PHONE)], skipped={}, prices=PRICES
    )
    assert plan.sent == {
        1: Accepted(wamid="wamid.1", wa_id="5511999990001", cost=Decimal("0.0625")),
        2: Accepted(wamid="wamid.2", wa_id="5511999990002", cost=Decimal("0.0700")),
    }
    assert plan.cost == Decimal("0.1325")
    assert plan.delay is None
    assert not (
        plan.failed or plan.unknown or plan.retry or plan.release or plan.opt_out or plan.pause_numbers
    )


def test_a_message_without_a_price_on_the_rate_card_costs_nothing():
    plan = batch_classify([_outcome(1, _accepted(1))], skipped={}, prices={})
    assert plan.sent[1].cost == Decimal("0")


def test_a_send_meta_may_have_accepted_is_of_unknown_outcome_and_never_resent():
    plan = batch_classify(
        [_outcome(1, _refused(Action.RETRY, maybe_accepted=True))], skipped={}, prices=PRICES
    )
    assert plan.unknown == {1: "outcome unknown: refused; not resent"}
    assert not (plan.retry or plan.failed or plan.release)
    assert plan.delay is None


def test_a_retryable_error_is_retried_until_the_last_attempt_then_fails():
    plan = batch_classify(
        [
            _outcome(1, _refused(Action.RETRY, 131056), attempts=1),
            _outcome(2, _refused(Action.RETRY, 131056), attempts=ATTEMPTS),
        ],
        skipped={},
        prices=PRICES,
    )
    assert plan.retry == [1]
    assert plan.failed == {2: Refused(code=131056, reason="refused")}
    assert plan.delay == RETRY_BACKOFF


def test_a_throttled_message_is_released_and_the_batch_waits_at_least_as_long_as_meta_asked():
    plan = batch_classify(
        [
            _outcome(1, _refused(Action.THROTTLED, 130429, retry_after=42.0)),
            _outcome(2, _refused(Action.THROTTLED, 130429)),
        ],
        skipped={},
        prices=PRICES,
    )
    assert plan.release == [1, 2]
    assert plan.retry_after == 42.0
    assert plan.delay == 42.0
    assert (
        batch_classify([_outcome(1, _refused(Action.THROTTLED))], skipped={}, prices={}).delay
        == THROTTLE_DELAY
    )


def test_a_refused_account_pauses_the_organization_and_releases_the_message():
    plan = batch_classify(
        [_outcome(1, _refused(Action.STOP_ORGANIZATION, 131031)), _outcome(2, _accepted(2))],
        skipped={},
        prices=PRICES,
    )
    assert plan.pause_organization == "[131031] refused"
    assert plan.release == [1]
    assert list(plan.sent) == [2]
    assert not plan.failed and not plan.pause_numbers
    assert plan.delay == PAUSED_DELAY * 2


def test_a_refused_number_pauses_that_number_only():
    plan = batch_classify(
        [_outcome(1, _refused(Action.PAUSE_NUMBER, 190), number=8), _outcome(2, _accepted(2), number=9)],
        skipped={},
        prices=PRICES,
    )
    assert plan.pause_numbers == {8: "[190] refused"}
    assert plan.release == [1]
    assert plan.pause_organization == ""
    assert plan.delay == PAUSED_DELAY * 2


def test_a_recipient_who_stopped_marketing_is_opted_out_and_the_message_fails():
    plan = batch_classify([_outcome(3, _refused(Action.OPT_OUT, 131050))], skipped={}, prices=PRICES)
    assert plan.opt_out == [103]
    assert plan.failed == {3: Refused(code=131050, reason="refused")}
    assert plan.stop_campaign == ""


def test_a_broken_template_fails_the_message_and_stops_the_campaign():
    plan = batch_classify([_outcome(1, _refused(Action.STOP_CAMPAIGN, 132001))], skipped={}, prices=PRICES)
    assert plan.stop_campaign == "[132001] refused"
    assert list(plan.failed) == [1]
    assert plan.opt_out == []


def test_a_failure_keeps_meta_s_details_cut_to_2000_characters():
    plan = batch_classify(
        [_outcome(1, _refused(Action.DROP_RECIPIENT, 131026, details="x" * 3000))], skipped={}, prices=PRICES
    )
    reason = plan.failed[1].reason
    assert reason.startswith("refused — xxx") and len(reason) == 2000


def test_the_messages_skipped_before_any_send_are_in_the_plan():
    plan = batch_classify([], skipped={5: "customer opted out or has no consent"}, prices=PRICES)
    assert plan.skipped == {5: "customer opted out or has no consent"}
    assert plan.counts == {"sent": 0, "failed": 0, "unknown": 0, "skipped": 1, "retry": 0, "throttled": 0}


def test_a_pause_outwaits_a_throttle_which_outwaits_a_retry():
    paused = BatchPlan(pause_numbers={1: "x"}, release=[1], retry=[2], retry_after=500.0)
    assert paused.delay == PAUSED_DELAY * 2
    assert BatchPlan(release=[1], retry=[2]).delay == THROTTLE_DELAY
    assert BatchPlan(retry=[2], retry_after=9.0).delay == 9.0


def test_reconciled_writes_only_the_rows_still_sending_and_keeps_a_webhook_s_cost():
    price = Decimal("0.0625")
    plan = BatchPlan(
        sent={
            1: Accepted("w1", "1", price),  # still sending: written as sent
            2: Accepted("w2", "2", price),  # delivered by its webhook, which priced it
            3: Accepted("w3", "3", price),  # read by its webhook, which did not price it
        },
        failed={4: Refused(131026, "no")},  # settled meanwhile (cancelled): left alone
        retry=[5],
        release=[6],
        opt_out=[104],
        pause_numbers={8: "token"},
    )
    current = {
        1: Status.SENDING,
        2: Status.DELIVERED,
        3: Status.READ,
        4: Status.CANCELLED,
        5: Status.SENDING,
        6: Status.QUEUED,
    }
    written = plan.reconciled(current, priced={2})
    assert list(written.sent) == [1]
    assert written.settled == {2: Accepted("w2", "2", None), 3: Accepted("w3", "3", price)}
    assert written.cost == price * 2  # the send's own and the read one's; the webhook counted the other
    assert written.failed == {} and written.retry == [5] and written.release == []
    assert written.opt_out == [104] and written.pause_numbers == {8: "token"}  # the customers' part stands
    assert written.counts["sent"] == 1 and written.counts["throttled"] == 0
    assert written.delay == PAUSED_DELAY * 2


# --- Whatever Meta answers -----------------------------------------------------------------------

_ACTIONS = st.sampled_from([*Action, None])
_result = st.one_of(
    st.builds(_accepted, st.integers(1, 99)),
    st.builds(
        lambda action, maybe, after: SendResult(
            error=IntegrationError("e", retryable=False, code=1),
            action=action,
            maybe_accepted=maybe,
            retry_after=after,
        ),
        _ACTIONS,
        st.booleans(),
        st.none() | st.floats(0, 3600),
    ),
)
_outcomes = st.lists(
    st.tuples(
        _result, st.integers(1, ATTEMPTS + 1), st.integers(1, 3), st.sampled_from([BR_PHONE, US_PHONE])
    ),
    max_size=25,
).map(
    lambda rows: [
        Outcome(message_id=i, customer_id=100 + i, number_id=n, attempts=a, phone=p, result=r)
        for i, (r, a, n, p) in enumerate(rows)
    ]
)


@given(_outcomes)
def test_every_message_gets_exactly_one_fate(outcomes):
    plan = batch_classify(outcomes, skipped={1000: "skipped"}, prices=PRICES)
    groups = [set(plan.sent), set(plan.failed), set(plan.unknown), set(plan.retry), set(plan.release)]
    assert sum(len(g) for g in groups) == len(outcomes)
    assert set().union(*groups) == {o.message_id for o in outcomes}
    assert set(plan.skipped) == {1000}
    # Never resent when Meta may have it; a retry only with an attempt left.
    by_id = {o.message_id: o for o in outcomes}
    assert all(not by_id[pk].result.maybe_accepted and by_id[pk].attempts < ATTEMPTS for pk in plan.retry)
    assert all(by_id[pk].result.action is Action.RETRY for pk in plan.unknown)


@given(_outcomes)
def test_the_customers_and_the_account_follow_meta_s_actions(outcomes):
    plan = batch_classify(outcomes, skipped={}, prices=PRICES)
    refused = [o for o in outcomes if not o.result.ok]
    assert plan.opt_out == [o.customer_id for o in refused if o.result.action is Action.OPT_OUT]
    assert set(plan.pause_numbers) == {o.number_id for o in refused if o.result.action is Action.PAUSE_NUMBER}
    assert bool(plan.pause_organization) == any(o.result.action is Action.STOP_ORGANIZATION for o in refused)
    assert bool(plan.stop_campaign) == any(o.result.action is Action.STOP_CAMPAIGN for o in refused)
    assert plan.retry_after == max((o.result.retry_after or 0.0 for o in refused), default=0.0)
    if plan.pause_organization or plan.pause_numbers:
        assert plan.delay == PAUSED_DELAY * 2
    elif plan.release or plan.retry:
        assert plan.delay is not None and plan.delay >= plan.retry_after
    else:
        assert plan.delay is None


_STATUSES = st.sampled_from(list(Status))


@given(_outcomes, st.data())
def test_reconciled_never_writes_a_row_that_is_no_longer_sending(outcomes, data):
    plan = batch_classify(outcomes, skipped={}, prices=PRICES)
    current = {o.message_id: data.draw(_STATUSES) for o in outcomes}
    priced = {pk for pk in current if data.draw(st.booleans())}
    written = plan.reconciled(current, priced)
    sending = {pk for pk, status in current.items() if status == Status.SENDING}
    for group in (written.sent, written.failed, written.unknown, written.retry, written.release):
        assert set(group) <= sending
    assert set(written.settled) <= set(plan.sent) - sending
    assert all((a.cost is None) == (pk in priced) for pk, a in written.settled.items())
    assert (written.opt_out, written.pause_numbers, written.pause_organization) == (
        plan.opt_out,
        plan.pause_numbers,
        plan.pause_organization,
    )
