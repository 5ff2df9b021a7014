"""Paired binary outcomes: a candidate and a reference judged on the same units.

Two engines driving the same scenario × seed (or reading the same frame) are a *pair*: what
makes a seed hard makes it hard for both, so the pairs that agree say nothing about which
engine is worse. Only the discordant pairs do — ``worse`` (only the candidate was bad) and
``better`` (only the reference was). Tests that ignore the pairing (Fisher on the two engines'
totals) spend the evidence of the concordant pairs as noise and lose most of their power.

* :func:`sign_test_p` — exact McNemar, one-sided: under "neither engine is worse" each
  discordant pair is a fair coin, so ``worse`` of ``worse + better`` is Binomial(·, ½).
  Exact at any count, and valid at zero or one discordant pair, where normal approximations
  mislead.
* :func:`tango_bound` — Tango's (1998) score confidence bound on the difference of the two
  engines' bad-outcome rates, ``(worse - better) / pairs``: the one-sided bound a
  non-inferiority decision ("not worse than the reference by more than δ") needs. Good
  coverage at small counts (Tango 1998; Agresti & Min 2005), unlike the Wald interval.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from math import sqrt

from scipy.stats import binom, norm

_BISECTION_STEPS = 80


@dataclass(frozen=True)
class PairedCounts:
    """Paired binary outcomes of a candidate against a reference.

    ``worse``: pairs where only the candidate was bad; ``better``: only the reference;
    ``pairs``: every pair, concordant ones included.
    """

    worse: int
    better: int
    pairs: int

    def __post_init__(self) -> None:
        if min(self.worse, self.better, self.pairs) < 0 or self.worse + self.better > self.pairs:
            raise ValueError(
                f"{self.worse} worse + {self.better} better discordant pairs of {self.pairs} "
                "pairs are not paired counts"
            )

    @classmethod
    def of(cls, candidate_bad: Iterable[bool], reference_bad: Iterable[bool]) -> PairedCounts:
        """Counts from two aligned sequences of outcomes (``True`` = bad)."""
        pairs = list(zip(candidate_bad, reference_bad, strict=True))
        return cls(
            worse=sum(bool(c) and not bool(r) for c, r in pairs),
            better=sum(bool(r) and not bool(c) for c, r in pairs),
            pairs=len(pairs),
        )

    def __add__(self, other: PairedCounts) -> PairedCounts:
        return PairedCounts(
            self.worse + other.worse, self.better + other.better, self.pairs + other.pairs
        )

    @property
    def discordant(self) -> int:
        return self.worse + self.better

    @property
    def difference(self) -> float:
        """Candidate's bad-outcome rate minus the reference's (0 without pairs)."""
        return (self.worse - self.better) / self.pairs if self.pairs else 0.0

    def sign_z(self) -> float:
        """The sign test's standardized excess of worse pairs (0 without discordant pairs)."""
        return (self.worse - self.better) / sqrt(self.discordant) if self.discordant else 0.0

    def to_dict(self) -> dict[str, int]:
        return {"worse": self.worse, "better": self.better, "pairs": self.pairs}


def total(counts: Iterable[PairedCounts]) -> PairedCounts:
    """The pooled counts of several strata (each pair is its own stratum: pooling the
    discordant pairs is the Mantel–Haenszel test for matched pairs)."""
    result = PairedCounts(0, 0, 0)
    for item in counts:
        result = result + item
    return result


def sign_test_p(worse: int, better: int) -> float:
    """One-sided exact McNemar p-value of "the candidate is bad more often than the reference".

    ``P(X >= worse)`` for ``X ~ Binomial(worse + better, 1/2)``; 1.0 without discordant pairs.
    A candidate no worse than the reference on the discordant pairs gets p >= 0.5.
    """
    if worse < 0 or better < 0:
        raise ValueError(f"discordant counts must be >= 0, got {worse} and {better}")
    n = worse + better
    if n == 0:
        return 1.0
    return float(binom.sf(worse - 1, n, 0.5))


def _tango_statistic(counts: PairedCounts, delta0: float) -> float:
    """Tango's score statistic for H0: difference = ``delta0`` (restricted ML variance)."""
    n, b, c = counts.pairs, counts.worse, counts.better
    a_coef = 2 * n
    b_coef = -b - c + (2 * n - b + c) * delta0
    c_coef = -c * delta0 * (1 - delta0)
    p_tilde = (sqrt(max(b_coef * b_coef - 4 * a_coef * c_coef, 0.0)) - b_coef) / (2 * a_coef)
    variance = n * (2 * p_tilde + delta0 * (1 - delta0))
    numerator = b - c - n * delta0
    if variance <= 0:
        return 0.0 if numerator == 0 else (float("inf") if numerator > 0 else float("-inf"))
    return numerator / sqrt(variance)


def tango_bound(counts: PairedCounts, alpha: float, *, upper: bool = True) -> float:
    """One-sided ``1 - alpha`` Tango score bound on ``counts.difference``.

    ``upper=True``: the difference is below the bound with confidence ``1 - alpha`` (the bound
    a non-inferiority decision compares with its margin); ``upper=False``: the lower bound.
    Without pairs nothing is known: ``1`` (upper) or ``-1`` (lower).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if counts.pairs == 0:
        return 1.0 if upper else -1.0
    z = float(norm.isf(alpha))
    target = -z if upper else z
    estimate = counts.difference
    # The statistic falls as delta0 rises; the bound is where it crosses the target.
    low, high = (estimate, 1.0) if upper else (-1.0, estimate)
    if upper and estimate >= 1.0:
        return 1.0
    if not upper and estimate <= -1.0:
        return -1.0
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2
        if _tango_statistic(counts, middle) > target:
            low = middle
        else:
            high = middle
    return (low + high) / 2
