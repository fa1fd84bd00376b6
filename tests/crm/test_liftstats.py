"""The lift statistics (crm.liftstats), pure: properties over any counts, and the honesty checks —
an A/A experiment's interval contains 0 in at least 93 of 100 seeded runs, a planted 30% lift is
detected at the documented power (80%), the minimum detectable lift of the issue's example."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from crm import liftstats
from crm.liftstats import Arm

BASE_RATE = 0.05


@st.composite
def arms(draw: st.DrawFn) -> Arm:
    customers = draw(st.integers(min_value=1, max_value=2_000_000))
    buyers = draw(st.integers(min_value=0, max_value=customers))
    revenue = draw(st.floats(min_value=0, max_value=1e9, allow_nan=False))
    return Arm(customers, buyers, revenue, revenue**2)


@given(arms(), arms())
def test_any_counts_give_an_interval_around_the_estimate_that_agrees_with_the_p_value(
    treatment: Arm, control: Arm
):
    result = liftstats.buyers_rate_lift(treatment, control)
    if treatment.buyers == control.buyers == 0:
        assert result is None  # nothing to compare yet
        return
    assert result is not None
    low, high = result.ci95
    assert all(math.isfinite(x) for x in (low, result.lift, result.p_value))
    assert -1 <= low <= result.lift <= high
    assert math.isfinite(high) or control.buyers == 0  # open above only with no buyer held out
    assert 0 <= result.p_value <= 1
    # One statistic: the interval excludes 0 exactly when the pooled test rejects (away from 5%).
    if abs(result.p_value - liftstats.ALPHA) > 1e-6:
        assert result.significant == (result.p_value < liftstats.ALPHA), (result, treatment, control)
    swapped = liftstats.buyers_rate_lift(control, treatment)
    assert swapped is not None and math.isclose(swapped.p_value, result.p_value, abs_tol=1e-12)


@given(arms(), arms())
def test_the_revenue_interval_holds_the_difference(treatment: Arm, control: Arm):
    result = liftstats.revenue_lift(treatment, control)
    if treatment.customers < 2 or control.customers < 2:
        assert result is None
        return
    assert result is not None
    low, high = result.ci95
    assert low <= result.difference <= high or math.isclose(low, high)
    assert 0 <= result.p_value <= 1


def test_an_empty_arm_has_no_report():
    assert liftstats.buyers_rate_lift(Arm(0, 0, 0.0), Arm(10, 1, 5.0)) is None


def test_no_buyer_in_either_arm_is_no_lift_whatever_the_arms_sizes():
    # With the continuity rule these read -87% (45 against 5) and a "significant" -100%.
    for treated, held_out in ((45, 5), (1_000_000, 10), (950_000, 50_000)):
        assert liftstats.buyers_rate_lift(Arm(treated, 0, 0.0), Arm(held_out, 0, 0.0)) is None
    assert liftstats.revenue_lift(Arm(1, 0, 0.0), Arm(10, 1, 5.0)) is None


def test_an_empty_cell_in_a_tiny_control_arm_is_no_certainty():
    # Katz with the 0.5 rule read this as a "significant" -100%: 0 of 10 held out tells little.
    result = liftstats.buyers_rate_lift(Arm(1_000_000, 1, 0.0), Arm(10, 0, 0.0))
    assert result is not None and not result.significant
    assert result.ci95[0] < 0 and result.ci95[1] == math.inf
    assert result.p_value > 0.9
    # No treated buyer against 3 of 10 held out: a drop, bounded below by -100%, not significant.
    result = liftstats.buyers_rate_lift(Arm(10, 0, 0.0), Arm(10, 3, 0.0))
    assert result is not None and result.lift == -1 and result.ci95[0] == -1 and not result.significant
    # Everyone bought in both arms: no effect, a bounded interval around 0.
    result = liftstats.buyers_rate_lift(Arm(10, 10, 0.0), Arm(10, 10, 0.0))
    assert result is not None and result.ci95[0] < 0 < result.ci95[1] < math.inf


def _simulate(rng: random.Random, n: int, rate: float, amount: float) -> Arm:
    """n customers each buying with probability `rate`, one sale of an exponential amount."""
    buyers, revenue, squares = 0, 0.0, 0.0
    for _ in range(n):
        if rng.random() < rate:
            value = rng.expovariate(1 / amount)
            buyers, revenue, squares = buyers + 1, revenue + value, squares + value * value
    return Arm(n, buyers, revenue, squares)


def _buyers(rng: random.Random, n: int, rate: float) -> Arm:
    buyers = sum(rng.random() < rate for _ in range(n))
    return Arm(n, buyers, 0.0)


def test_the_buyers_rate_interval_covers_a_null_effect_95_percent_of_the_time():
    # The method's coverage over 1,000 seeded A/A runs (measured: 95.6%); 100 runs alone vary by ±2.2.
    runs, covered = 1000, 0
    for seed in range(runs):
        rng = random.Random(seed)
        result = liftstats.buyers_rate_lift(_buyers(rng, 4000, BASE_RATE), _buyers(rng, 4000, BASE_RATE))
        assert result is not None
        covered += result.ci95[0] <= 0 <= result.ci95[1]
    assert 0.935 <= covered / runs <= 0.965, covered


def test_an_a_a_experiment_reports_an_interval_containing_zero_in_at_least_93_of_100_runs():
    covered_rate = covered_revenue = 0
    for seed in range(100):
        rng = random.Random(20261203 + seed)
        treatment = _simulate(rng, 4000, BASE_RATE, 150.0)
        control = _simulate(rng, 4000, BASE_RATE, 150.0)
        rate = liftstats.buyers_rate_lift(treatment, control)
        revenue = liftstats.revenue_lift(treatment, control)
        assert rate is not None and revenue is not None
        covered_rate += rate.ci95[0] <= 0 <= rate.ci95[1]
        covered_revenue += revenue.ci95[0] <= 0 <= revenue.ci95[1]
    assert covered_rate >= 93, covered_rate
    assert covered_revenue >= 93, covered_revenue


def test_a_planted_30_percent_lift_is_detected_at_the_documented_power():
    # The arms' size at which a +30% lift of a 5% rate has 80% power (5% two-sided).
    n = 1
    while liftstats.power(treatment=n, control=n, base_rate=BASE_RATE, lift=0.3) < liftstats.POWER:
        n += 50
    mde = liftstats.minimum_detectable_lift(treatment=n, control=n, base_rate=BASE_RATE)
    assert mde is not None and 0.28 <= mde <= 0.31
    runs, detected = 200, 0
    for seed in range(runs):
        rng = random.Random(1000 + seed)
        control = _simulate(rng, n, BASE_RATE, 150.0)
        treatment = _simulate(rng, n, BASE_RATE * 1.3, 150.0)
        result = liftstats.buyers_rate_lift(treatment, control)
        assert result is not None
        detected += result.ci95[0] > 0
    # 80% of 200 is 160 (standard deviation 5.7): detected at the documented power, within noise.
    assert 145 <= detected <= 180, detected


def test_the_minimum_detectable_lift_of_the_issues_example_is_about_6_percent():
    # 1,000,000 customers, a 5% holdout, 5% buyers.
    mde = liftstats.minimum_detectable_lift(treatment=950_000, control=50_000, base_rate=0.05)
    assert mde is not None and 0.05 <= mde <= 0.07
    assert liftstats.minimum_detectable_lift(treatment=100, control=0, base_rate=0.05) is None
