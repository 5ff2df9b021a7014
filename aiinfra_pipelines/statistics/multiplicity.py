"""Many tests at once: controlling the chance that any of them refuses by accident.

A gate that tests every scenario of a library (or every slice) refuses an equal candidate
whenever *one* test fires by chance, so the level is set for the family, not for each test.
Holm's step-down procedure controls that family-wise error at ``alpha`` under any dependence
between the tests and is never less powerful than Bonferroni (Holm 1979).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

Key = TypeVar("Key")


def holm_rejections(p_values: Mapping[Key, float], alpha: float) -> dict[Key, float]:
    """The tests Holm's procedure rejects at family-wise level ``alpha``, each with the level
    it was held to (``alpha / (m - rank)``, rank from the smallest p-value).

    Sorted by p-value (ties by key order of ``p_values``); the step-down stops at the first
    p-value above its level, so nothing after it is rejected.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    ordered = sorted(p_values.items(), key=lambda item: item[1])
    m = len(ordered)
    rejected: dict[Key, float] = {}
    for rank, (key, p_value) in enumerate(ordered):
        level = alpha / (m - rank)
        if p_value > level:
            break
        rejected[key] = level
    return rejected


def holm_level(p_values: Mapping[Key, float], key: Key, alpha: float) -> float:
    """The level Holm's procedure holds ``key``'s test to (what a report shows beside its
    p-value): ``alpha / (m - rank)``."""
    ordered = sorted(p_values, key=lambda k: p_values[k])
    return alpha / (len(ordered) - ordered.index(key))
