"""The statistics of a lift report: pure functions of counts and sums, no database.

Two arms of one randomized experiment (a campaign's control arm, docs/analytics.md):

- **Buyers rate, relative lift** = (treatment rate - control rate) ÷ control rate (0.25 = +25%).
  Its 95% interval is Koopman's score interval for the risk ratio, minus one: the ratios the
  score test does not reject (exact in its handling of empty cells: an open side, never a made-up
  certainty; `math.inf` for an upper bound without limit). The p-value is the two-sided pooled
  two-proportion z-test — the same score statistic at ratio 1, so the two always agree.
- **Revenue per customer** (every customer of the arm, non-buyers at 0): the difference of the
  means with Welch's 95% interval (Welch-Satterthwaite degrees of freedom; the t quantile by
  Cornish-Fisher expansion, exact enough beyond 3 degrees of freedom).
- **Incremental revenue** = that difference * the treated customers.
- **Minimum detectable lift**: the relative lift a two-sided 5% test detects with 80% power for
  the arms' sizes and a base rate: (z₀.₉₇₅ + z₀.₈) · √(p(1-p)(1/n₁ + 1/n₀)) ÷ p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

ALPHA = 0.05
POWER = 0.80
_Z = NormalDist()


def z_quantile(p: float) -> float:
    return _Z.inv_cdf(p)


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (Cornish-Fisher; normal as df → ∞)."""
    z = z_quantile(p)
    if not math.isfinite(df) or df > 1e7:
        return z
    df = max(df, 1.0)
    z3, z5, z7 = z**3, z**5, z**7
    return (
        z
        + (z3 + z) / (4 * df)
        + (5 * z5 + 16 * z3 + 3 * z) / (96 * df**2)
        + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * df**3)
    )


@dataclass(frozen=True)
class Arm:
    """One arm: its customers, those who bought, their revenue and the sum of each customer's
    revenue squared (for the variance of revenue per customer)."""

    customers: int
    buyers: int
    revenue: float
    revenue_squares: float = 0.0

    @property
    def rate(self) -> float:
        return self.buyers / self.customers if self.customers else 0.0

    @property
    def mean(self) -> float:
        return self.revenue / self.customers if self.customers else 0.0

    @property
    def variance(self) -> float:
        """The sample variance of revenue per customer (non-buyers at 0)."""
        n = self.customers
        if n < 2:
            return 0.0
        return max(0.0, (self.revenue_squares - n * self.mean**2) / (n - 1))


@dataclass(frozen=True)
class RateLift:
    lift: float  # relative: 0.25 = +25%
    ci95: tuple[float, float]
    p_value: float
    absolute: float  # treatment rate - control rate

    @property
    def significant(self) -> bool:
        return self.ci95[0] > 0 or self.ci95[1] < 0


@dataclass(frozen=True)
class MeanLift:
    difference: float  # revenue per customer, treatment - control
    ci95: tuple[float, float]
    p_value: float

    @property
    def significant(self) -> bool:
        return self.ci95[0] > 0 or self.ci95[1] < 0


def buyers_rate_lift(treatment: Arm, control: Arm, *, alpha: float = ALPHA) -> RateLift | None:
    """Relative lift of the buyers rate with its (1 - alpha) interval and p-value; None when an
    arm has no customer, or no arm has a buyer yet (nothing to compare: a continuity rule would
    read the arms' sizes as an effect, -87% for 45 against 5 treated and held out).

    The interval is Koopman's score interval for the risk ratio (minus one): every ratio the score
    test at that ratio does not reject. It needs no made-up half buyers, so an empty cell gives an
    open side instead of a false certainty — 1 buyer in 1,000,000 against 0 of 10 held out is
    (-100%, +inf), not a "significant" drop — and the interval excludes 0 exactly when the pooled
    test's p-value is below alpha (the same statistic at ratio 1). An upper bound without limit is
    `math.inf`. The estimate is the observed ratio; with no control buyer (an infinite ratio) the
    Haldane-Anscombe corrected one, kept inside the interval."""
    n1, b1, n0, b0 = treatment.customers, treatment.buyers, control.customers, control.buyers
    if n1 <= 0 or n0 <= 0 or b1 == b0 == 0:
        return None
    absolute = b1 / n1 - b0 / n0
    chi2 = z_quantile(1 - alpha / 2) ** 2
    low, high = _score_interval(b1, n1, b0, n0, chi2)
    observed = b0 > 0
    ratio = (b1 / n1) / (b0 / n0) if observed else ((b1 + 0.5) / (n1 + 1)) / (0.5 / (n0 + 1))
    ratio = min(max(ratio, low), high)
    return RateLift(
        lift=ratio - 1, ci95=(low - 1, high - 1), p_value=_two_proportion_p(b1, n1, b0, n0), absolute=absolute
    )


_LOG_RATIO_BOUND = 60.0  # ratios beyond e^±60 are 0 or without limit for any count a table holds


def _score(ratio: float, b1: int, n1: int, b0: int, n0: int) -> float:
    """Koopman's chi-square at a risk ratio: Pearson's statistic with both arms' rates at their
    maximum likelihood under treatment rate = ratio * control rate (the smaller root of
    ratio·N·p² - (ratio·(n1 + b0) + b1 + n0)·p + (b1 + b0) = 0, in its cancellation-free form)."""
    total, buyers = n1 + n0, b1 + b0
    b = ratio * (n1 + b0) + b1 + n0
    root = math.sqrt(max(0.0, b * b - 4 * ratio * total * buyers))
    p0 = min(1.0, 2 * buyers / (b + root))
    p1 = min(1.0, ratio * p0)
    return _pearson(b1, n1, p1) + _pearson(b0, n0, p0)


def _pearson(buyers: int, customers: int, rate: float) -> float:
    expected = customers * rate
    spread = expected * (1 - rate)
    deviation = buyers - expected
    if spread <= 0:
        return 0.0 if abs(deviation) < 1e-9 * max(1, customers) else math.inf
    return deviation * deviation / spread


def _score_interval(b1: int, n1: int, b0: int, n0: int, chi2: float) -> tuple[float, float]:
    """The risk ratios the score test does not reject, by bisection on the log ratio from the
    estimate outwards (the statistic rises monotonically on each side of it)."""
    if b1 == 0:
        centre = -_LOG_RATIO_BOUND
    elif b0 == 0:
        centre = _LOG_RATIO_BOUND
    else:
        centre = math.log((b1 / n1) / (b0 / n0))

    def bound(outer: float) -> float:
        if _score(math.exp(outer), b1, n1, b0, n0) <= chi2:
            return outer  # not rejected however far: the side is open
        inner = centre
        for _ in range(100):
            middle = (inner + outer) / 2
            if _score(math.exp(middle), b1, n1, b0, n0) <= chi2:
                inner = middle
            else:
                outer = middle
        return inner

    low = -_LOG_RATIO_BOUND if b1 == 0 else bound(-_LOG_RATIO_BOUND)
    high = _LOG_RATIO_BOUND if b0 == 0 else bound(_LOG_RATIO_BOUND)
    return (
        0.0 if low <= -_LOG_RATIO_BOUND else math.exp(low),
        math.inf if high >= _LOG_RATIO_BOUND else math.exp(high),
    )


def _two_proportion_p(b1: int, n1: int, b0: int, n0: int) -> float:
    pooled = (b1 + b0) / (n1 + n0)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n0))
    if se == 0:
        return 1.0
    z = (b1 / n1 - b0 / n0) / se
    return min(1.0, 2 * (1 - _Z.cdf(abs(z))))


def revenue_lift(treatment: Arm, control: Arm, *, alpha: float = ALPHA) -> MeanLift | None:
    """Difference of revenue per customer with Welch's interval and p-value; None below two
    customers in an arm."""
    n1, n0 = treatment.customers, control.customers
    if n1 < 2 or n0 < 2:
        return None
    v1, v0 = treatment.variance / n1, control.variance / n0
    difference = treatment.mean - control.mean
    se = math.sqrt(v1 + v0)
    if se == 0:
        return MeanLift(difference=difference, ci95=(difference, difference), p_value=1.0)
    spread = v1**2 / (n1 - 1) + v0**2 / (n0 - 1)
    df = (v1 + v0) ** 2 / spread if spread > 0 else math.inf
    half = t_quantile(1 - alpha / 2, df) * se
    # The p-value from the normal beyond a few dozen degrees of freedom (the t's tail otherwise).
    stat = abs(difference) / se
    p = 2 * (1 - _Z.cdf(stat / math.sqrt(1 + 1 / (2 * df)) if df < 30 else stat))
    return MeanLift(difference=difference, ci95=(difference - half, difference + half), p_value=min(1.0, p))


def minimum_detectable_lift(
    *, treatment: int, control: int, base_rate: float, alpha: float = ALPHA, power: float = POWER
) -> float | None:
    """The smallest relative lift of the buyers rate a two-sided test at `alpha` detects with
    `power`, for arms of these sizes and a control rate `base_rate`; None when it cannot be told."""
    if treatment <= 0 or control <= 0 or not 0 < base_rate < 1:
        return None
    z = z_quantile(1 - alpha / 2) + z_quantile(power)
    return z * math.sqrt(base_rate * (1 - base_rate) * (1 / treatment + 1 / control)) / base_rate


def power(*, treatment: int, control: int, base_rate: float, lift: float, alpha: float = ALPHA) -> float:
    """The probability that the test detects a true relative lift `lift` (normal approximation)."""
    p0, p1 = base_rate, min(1.0, base_rate * (1 + lift))
    se = math.sqrt(p0 * (1 - p0) / control + p1 * (1 - p1) / treatment)
    if se == 0:
        return 1.0
    return _Z.cdf(abs(p1 - p0) / se - z_quantile(1 - alpha / 2))
