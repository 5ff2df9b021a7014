"""How far a slice's change could move by chance: a paired bootstrap over benchmark frames.

The candidate and its reference are scored on the same frames; resampling frames (the same
indices for both) gives the spread of the metric's difference that the slice's sample size
allows — a 2 m lead-gap budget on a 53-frame slice sits inside it, on a 1,500-frame overall
row it does not. The bootstrap's generator is seeded from the row, the metric and the sample
size, so a verdict is a pure function of the predictions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from .frame_scores import HIGHER_IS_BETTER, PairedFrames, metrics_from_sums


@dataclass(frozen=True)
class RowTest:
    """One table row and metric: the candidate's regression (positive = worse), its bootstrap
    standard error, and the one-sided p-value that it exceeds ``offset`` only by chance."""

    regression: float
    standard_error: float
    p_value: float
    frames: int


def row_tests(
    pair: PairedFrames, row: str, offsets: Mapping[str, float], *, resamples: int
) -> dict[str, RowTest]:
    """Per metric of ``offsets``, the paired test of "``regression > offset``" on ``row``'s
    frames (empty: no frames).

    ``offset`` is 0 against production (is the candidate worse at all?) and ``-margin`` on a
    first release (does it fall short of beating the baseline by the margin?). Every resample
    weighs the same frames for both models (Poisson bootstrap weights); the p-value is the normal
    tail of the bootstrap-standardized excess, and with no spread (identical scores) 0 for an
    excess and 1 otherwise.
    """
    frames = pair.rows(row)
    n = len(frames)
    if n == 0:
        return {}
    candidate = pair.candidate.columns()[frames]
    reference = pair.reference.columns()[frames]
    rng = np.random.default_rng(_seed(row, n))
    weights = rng.poisson(1.0, size=(resamples, n)).astype(np.float64)
    drawn = np.maximum(weights.sum(axis=1), 1.0)
    point = _regressions(candidate.sum(axis=0), reference.sum(axis=0), n)
    spread = _regressions(weights @ candidate, weights @ reference, drawn)
    tests = {}
    for metric, offset in offsets.items():
        deviation = float(np.std(spread[metric], ddof=1)) if resamples > 1 else 0.0
        excess = float(point[metric]) - offset
        no_spread = 0.0 if excess > 0 else 1.0
        p_value = float(norm.sf(excess / deviation)) if deviation > 0 else no_spread
        tests[metric] = RowTest(float(point[metric]), deviation, p_value, n)
    return tests


def _regressions(
    candidate: np.ndarray, reference: np.ndarray, frames: np.ndarray | float
) -> dict[str, np.ndarray]:
    ours, theirs = metrics_from_sums(candidate, frames), metrics_from_sums(reference, frames)
    return {
        metric: theirs[metric] - ours[metric] if higher else ours[metric] - theirs[metric]
        for metric, higher in HIGHER_IS_BETTER.items()
    }


def _seed(row: str, frames: int) -> int:
    digest = hashlib.sha256(f"offline-gate|{row}|{frames}".encode()).digest()
    return int.from_bytes(digest[:8], "big")
