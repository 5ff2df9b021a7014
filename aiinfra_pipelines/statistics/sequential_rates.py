"""Rare-event rates of two concurrent cohorts, judged after every telemetry batch.

The question a rollout stage asks of collisions (or near misses): is the candidate cohort's
rate worse than the control cohort's, or not worse by more than a margin? Conditional on the
number of events in a batch, the candidate's share of them is binomial with
``p = r·a / (r·a + b)`` (``r`` the rate ratio, ``a`` and ``b`` the cohorts' exposures): exact, and
valid at zero or one event, where a point estimate against a budget decides by luck.

Telemetry arrives batch after batch and the stage is judged after each one, so a fixed-level test
would be peeking. The evidence here is a *mixture likelihood ratio* (the mixture SPRT; an
e-process): for "harm", the likelihood of the batches under rate ratios above 1, averaged over a
grid of alternatives, against their likelihood at ``r = 1``; for "non-inferiority", under ratios
below the margin against ``r = margin``. Each is a non-negative supermartingale under its null
(the binomial family is monotone in ``r``), so by Ville's inequality the chance it *ever* reaches
``1/alpha`` is at most ``alpha``, however many batches are looked at and whenever the looking
stops: always-valid, with any number of looks.

Three outcomes: ``harm`` (roll back), ``non_inferior`` (may advance), ``undecided`` (collect
more), the last with the exposure still needed for a decision either way at the current rates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.special import logsumexp

from aiinfra_pipelines.statistics.binomial import clopper_pearson

Outcome = Literal["harm", "non_inferior", "undecided"]

# Projecting the exposure still needed: search up to this multiple of what was seen (or of the
# exposure one expected event takes), then give up ("not at the current rates").
_PROJECTION_LIMIT = 1e4


@dataclass(frozen=True)
class RateBatch:
    """One telemetry batch: events and exposure (frames) of each cohort."""

    candidate_events: float
    candidate_exposure: float
    control_events: float
    control_exposure: float


@dataclass(frozen=True)
class RateTest:
    """The two sequential tests of one event type (gates.yaml ``release.rollout.events``)."""

    margin: float  # the rate ratio non-inferiority must rule out (candidate/control)
    harm_alpha: float  # level of "worse than control" (a false rollback at most this often)
    noninferiority_alpha: float  # level of "not worse than margin" (a harmful advance)
    harm_alternatives: tuple[float, ...]  # ratios > 1 the harm mixture weighs equally
    noninferiority_alternatives: tuple[float, ...]  # ratios < margin, likewise

    def __post_init__(self) -> None:
        if self.margin <= 1.0:
            raise ValueError(f"a non-inferiority margin must be a rate ratio above 1: {self}")
        for alpha in (self.harm_alpha, self.noninferiority_alpha):
            if not 0.0 < alpha < 1.0:
                raise ValueError(f"levels must be in (0, 1): {self}")
        if not self.harm_alternatives or min(self.harm_alternatives) <= 1.0:
            raise ValueError(f"harm alternatives must be ratios above 1: {self}")
        alternatives = self.noninferiority_alternatives
        if not alternatives or max(alternatives) >= self.margin or min(alternatives) <= 0:
            raise ValueError(f"non-inferiority alternatives must lie in (0, margin): {self}")


@dataclass(frozen=True)
class RateVerdict:
    """What the batches so far show, with the numbers an operator reads."""

    outcome: Outcome
    candidate_events: float
    candidate_exposure: float
    control_events: float
    control_exposure: float
    rate_ratio: float | None  # pooled estimate (None without control events or exposure)
    ratio_interval: tuple[float, float | None]  # 95 % exact conditional interval (None: open)
    harm_e_value: float
    noninferiority_e_value: float
    exposure_needed: float | None  # more candidate exposure for a decision; None: not in reach

    def as_dict(self) -> dict[str, object]:
        low, high = self.ratio_interval
        return {
            "outcome": self.outcome,
            "candidate_events": self.candidate_events,
            "candidate_exposure": self.candidate_exposure,
            "control_events": self.control_events,
            "control_exposure": self.control_exposure,
            "rate_ratio": None if self.rate_ratio is None else round(self.rate_ratio, 4),
            "rate_ratio_ci95": [round(low, 4), None if high is None else round(high, 4)],
            "harm_e_value": round(self.harm_e_value, 4),
            "noninferiority_e_value": round(self.noninferiority_e_value, 4),
            "exposure_needed": None
            if self.exposure_needed is None
            else round(self.exposure_needed),
        }


def _arrays(batches: Sequence[RateBatch]) -> tuple[np.ndarray, ...]:
    """Batches that carry information: both cohorts exposed and at least one event."""
    rows = [
        (b.candidate_events, b.candidate_exposure, b.control_events, b.control_exposure)
        for b in batches
        if b.candidate_exposure > 0
        and b.control_exposure > 0
        and b.candidate_events + b.control_events > 0
    ]
    if not rows:
        empty = np.zeros(0)
        return empty, empty, empty, empty
    table = np.asarray(rows, dtype=float)
    return table[:, 0], table[:, 1], table[:, 2], table[:, 3]


def log_likelihood(batches: Sequence[RateBatch], ratio: float) -> float:
    """Conditional log-likelihood of the candidates' share of each batch's events at ``ratio``."""
    x, a, y, b = _arrays(batches)
    if len(x) == 0:
        return 0.0
    share = ratio * a / (ratio * a + b)
    return float(np.sum(x * np.log(share) + y * np.log1p(-share)))


def mixture_e_value(
    batches: Sequence[RateBatch], null_ratio: float, alternatives: Iterable[float]
) -> float:
    """Mixture likelihood ratio of ``alternatives`` (equal weights) against ``null_ratio``."""
    null = log_likelihood(batches, null_ratio)
    logs = [log_likelihood(batches, ratio) - null for ratio in alternatives]
    return float(math.exp(min(logsumexp(logs) - math.log(len(logs)), 700.0)))


def pooled_ratio(batches: Sequence[RateBatch]) -> tuple[float | None, tuple[float, float | None]]:
    """Rate-ratio estimate over all batches and its 95 % exact conditional interval
    (Clopper–Pearson on the candidates' share of events, mapped through the pooled exposures)."""
    x = sum(b.candidate_events for b in batches)
    a = sum(b.candidate_exposure for b in batches)
    y = sum(b.control_events for b in batches)
    b_ = sum(b.control_exposure for b in batches)
    if a <= 0 or b_ <= 0:
        return None, (0.0, None)
    n = round(x + y)
    low_share, high_share = clopper_pearson(min(round(x), n), n) if n else (0.0, 1.0)

    def to_ratio(share: float) -> float | None:
        return None if share >= 1.0 else share / (1.0 - share) * b_ / a

    estimate = None if y <= 0 else (x / a) / (y / b_)
    return estimate, (to_ratio(low_share) or 0.0, to_ratio(high_share))


def _decide(test: RateTest, batches: Sequence[RateBatch]) -> tuple[Outcome, float, float]:
    harm = mixture_e_value(batches, 1.0, test.harm_alternatives)
    non_inferior = mixture_e_value(batches, test.margin, test.noninferiority_alternatives)
    if harm >= 1.0 / test.harm_alpha:
        return "harm", harm, non_inferior
    if non_inferior >= 1.0 / test.noninferiority_alpha:
        return "non_inferior", harm, non_inferior
    return "undecided", harm, non_inferior


def exposure_needed(
    test: RateTest, batches: Sequence[RateBatch], prior_rate: float
) -> float | None:
    """More candidate exposure after which the test decides, if the cohorts go on at the rates
    seen so far (each shrunk towards ``prior_rate`` events per unit exposure by half an event)
    and in the same proportion of exposure; ``None`` when no amount decides at those rates."""
    a = sum(b.candidate_exposure for b in batches)
    b_ = sum(b.control_exposure for b in batches)
    if a <= 0 or b_ <= 0:
        return None
    x = sum(b.candidate_events for b in batches)
    y = sum(b.control_events for b in batches)
    shrink = 0.5 / prior_rate if prior_rate > 0 else 0.0
    rate_c = (x + 0.5) / (a + shrink)
    rate_0 = (y + 0.5) / (b_ + shrink)
    per_unit = b_ / a

    def decided(extra: float) -> bool:
        projected = RateBatch(rate_c * extra, extra, rate_0 * extra * per_unit, extra * per_unit)
        return _decide(test, [*batches, projected])[0] != "undecided"

    high = max(a, 1.0 / max(rate_0, 1e-12))
    limit = high * _PROJECTION_LIMIT
    while not decided(high):
        high *= 2.0
        if high > limit:
            return None
    low = 0.0
    for _ in range(40):
        middle = (low + high) / 2.0
        low, high = (low, middle) if decided(middle) else (middle, high)
    return high


def judge_rates(test: RateTest, batches: Sequence[RateBatch], prior_rate: float) -> RateVerdict:
    """The sequential verdict on ``batches`` (every batch of the stage so far)."""
    outcome, harm, non_inferior = _decide(test, batches)
    ratio, interval = pooled_ratio(batches)
    needed = None if outcome != "undecided" else exposure_needed(test, batches, prior_rate)
    return RateVerdict(
        outcome=outcome,
        candidate_events=sum(b.candidate_events for b in batches),
        candidate_exposure=sum(b.candidate_exposure for b in batches),
        control_events=sum(b.control_events for b in batches),
        control_exposure=sum(b.control_exposure for b in batches),
        rate_ratio=ratio,
        ratio_interval=interval,
        harm_e_value=harm,
        noninferiority_e_value=non_inferior,
        exposure_needed=needed,
    )
