"""One engine's rate of bad outcomes, with an exact confidence interval.

Clopper–Pearson: the interval never covers less than its nominal level, at zero events too
(where a Wald interval collapses to a point and claims certainty it does not have).
"""

from __future__ import annotations

from scipy.stats import beta


def clopper_pearson(events: int, trials: int, alpha: float = 0.05) -> tuple[float, float]:
    """Two-sided ``1 - alpha`` exact interval for a binomial rate (``(0, 1)`` without trials)."""
    if events < 0 or trials < 0 or events > trials:
        raise ValueError(f"{events} events of {trials} trials is not a binomial count")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if trials == 0:
        return 0.0, 1.0
    low = 0.0 if events == 0 else float(beta.ppf(alpha / 2, events, trials - events + 1))
    high = 1.0 if events == trials else float(beta.isf(alpha / 2, events + 1, trials - events))
    return low, high
