"""The AMQP consumer's acknowledgement bookkeeping (`amqp.settlement_plan`) against a model of
RabbitMQ's rules: a basic.ack/basic.nack must name a tag the channel holds unsettled, or the broker
closes the channel (406 PRECONDITION_FAILED, unknown delivery tag); multiple=True settles every
unsettled tag at or below it."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from integrations.runner.amqp import Outcome, Settle, settlement_plan


class ChannelError(Exception):
    pass


def broker_applies(unsettled: set[int], plan: list[Settle]) -> dict[int, Outcome]:
    """What a RabbitMQ channel does with `plan`: each tag's outcome; raises like the broker would."""
    open_tags = set(unsettled)
    settled: dict[int, Outcome] = {}
    for call in plan:
        if call.delivery_tag not in open_tags:
            raise ChannelError(f"PRECONDITION_FAILED - unknown delivery tag {call.delivery_tag}")
        reached = [t for t in open_tags if t <= call.delivery_tag] if call.multiple else [call.delivery_tag]
        for tag in reached:
            settled[tag] = call.outcome
            open_tags.discard(tag)
    return settled


outcomes = st.sampled_from(list(Outcome))


@st.composite
def channels(draw: st.DrawFn) -> tuple[set[int], dict[int, Outcome]]:
    """Unsettled tags (gaps: earlier batches settled) and decisions for some of them, plus some
    decisions for tags already settled (a message decided twice, or from an earlier channel)."""
    tags = draw(st.lists(st.integers(1, 60), unique=True, max_size=30))
    decided = draw(st.lists(st.sampled_from(tags), unique=True)) if tags else []
    decisions = {t: draw(outcomes) for t in decided}
    stale = draw(st.lists(st.integers(1, 80).filter(lambda t: t not in tags), max_size=3))
    decisions.update({t: draw(outcomes) for t in stale})
    return set(tags), decisions


@settings(max_examples=1000, deadline=None)
@given(channels())
def test_every_decided_tag_is_settled_once_with_its_outcome_and_nothing_else(channel):
    unsettled, decisions = channel
    plan = settlement_plan(unsettled, decisions)
    settled = broker_applies(unsettled, plan)  # raises on a tag the broker would refuse
    assert settled == {t: o for t, o in decisions.items() if t in unsettled}
    assert len({c.delivery_tag for c in plan}) == len(plan)


@settings(max_examples=300, deadline=None)
@given(st.lists(outcomes, min_size=1, max_size=40))
def test_a_whole_batch_takes_one_call_per_run_of_one_outcome(batch):
    tags = list(range(1, len(batch) + 1))
    plan = settlement_plan(tags, dict(zip(tags, batch, strict=True)))
    runs = 1 + sum(1 for a, b in itertools.pairwise(batch) if a is not b)
    assert len(plan) == runs
    assert broker_applies(set(tags), plan) == dict(zip(tags, batch, strict=True))


def test_a_batch_ending_in_a_dropped_message_acknowledges_only_up_to_the_stored_ones():
    plan = settlement_plan({1, 2, 3}, {1: Outcome.ACK, 2: Outcome.ACK, 3: Outcome.DROP})
    assert plan == [Settle(Outcome.ACK, 2, multiple=True), Settle(Outcome.DROP, 3, multiple=False)]


def test_a_tag_below_an_undecided_one_is_never_reached_by_a_multiple_call():
    plan = settlement_plan({1, 2, 3, 4}, {1: Outcome.ACK, 3: Outcome.ACK, 4: Outcome.ACK})
    assert plan == [
        Settle(Outcome.ACK, 1, multiple=False),
        Settle(Outcome.ACK, 3, multiple=False),
        Settle(Outcome.ACK, 4, multiple=False),
    ]
    assert broker_applies({1, 2, 3, 4}, plan) == {1: Outcome.ACK, 3: Outcome.ACK, 4: Outcome.ACK}
