"""Per-frame scores: what every slice metric is a sum of, so frames can be resampled exactly.

A slice's accuracy is correct cells over cells, its F1 comes from true/false positives and false
negatives, its lead-gap MAE is a mean of per-frame errors — all sums over frames. Keeping the
per-frame terms (not only the slice's figure) lets the offline gate ask how much a slice's
figure could move by chance, with the frame as the unit (cells within a frame are correlated:
one car seen wrong flips several at once), and pairs a candidate with its reference frame by
frame on the same benchmark.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np

METRICS = ("occupancy_accuracy", "occupancy_f1", "lead_gap_mae_m")
HIGHER_IS_BETTER: dict[str, bool] = {
    "occupancy_accuracy": True,
    "occupancy_f1": True,
    "lead_gap_mae_m": False,
}


@dataclass(frozen=True)
class FrameScores:
    """One model on N frames: per frame, correct cells, cells, tp / fp / fn, and the lead-gap
    error in metres."""

    correct: np.ndarray
    cells: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    fn: np.ndarray
    gap_error_m: np.ndarray

    @classmethod
    def of(
        cls,
        occupancy_prob: np.ndarray,
        occupancy_target: np.ndarray,
        gap_pred_norm: np.ndarray,
        gap_target_norm: np.ndarray,
        max_range: float,
        threshold: float = 0.5,
    ) -> FrameScores:
        """From predictions and labels, as ``training.metrics`` thresholds and scales them."""
        prob = np.asarray(occupancy_prob, dtype=np.float64)
        target = np.asarray(occupancy_target, dtype=np.float64)
        n = len(prob)
        predicted = (prob >= threshold).reshape(n, -1)
        actual = (target >= 0.5).reshape(n, -1)
        gap_pred = np.asarray(gap_pred_norm, dtype=np.float64).reshape(-1)
        gap_target = np.asarray(gap_target_norm, dtype=np.float64).reshape(-1)
        return cls(
            correct=(predicted == actual).sum(axis=1),
            cells=np.full(n, predicted.shape[1]),
            tp=(predicted & actual).sum(axis=1),
            fp=(predicted & ~actual).sum(axis=1),
            fn=(~predicted & actual).sum(axis=1),
            gap_error_m=np.abs(gap_pred - gap_target) * float(max_range),
        )

    def __len__(self) -> int:
        return len(self.correct)

    def columns(self) -> np.ndarray:
        """N x 6: correct, cells, tp, fp, fn, gap error — the terms every metric sums."""
        return np.column_stack(
            [self.correct, self.cells, self.tp, self.fp, self.fn, self.gap_error_m]
        ).astype(np.float64)


def metrics_from_sums(sums: np.ndarray, frames: np.ndarray | float) -> dict[str, np.ndarray]:
    """Every metric from summed terms (``sums``: ... x 6 as :meth:`FrameScores.columns`) over
    ``frames`` frames each (a weighted resample sums to as many frames as it draws)."""
    correct, cells, tp, fp, fn, gap = (sums[..., i] for i in range(6))
    denominator = 2 * tp + fp + fn
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(denominator == 0, 1.0, 2 * tp / np.maximum(denominator, 1e-12))
    return {
        "occupancy_accuracy": correct / cells,
        "occupancy_f1": f1,
        "lead_gap_mae_m": gap / frames,
    }


@dataclass(frozen=True)
class PairedFrames:
    """A candidate and its reference (production, or the no-camera baseline) scored on the
    same benchmark frames, with each frame's slice name."""

    slices: np.ndarray
    candidate: FrameScores
    reference: FrameScores

    def __post_init__(self) -> None:
        if not len(self.slices) == len(self.candidate) == len(self.reference):
            raise ValueError(
                f"paired frames are not aligned: {len(self.slices)} slices, "
                f"{len(self.candidate)} candidate and {len(self.reference)} reference scores"
            )

    def rows(self, name: str) -> np.ndarray:
        """The frames a table row covers: a slice, a condition row (``night/*/*``) or
        ``overall``."""
        slices = self.slices.astype(str)
        if name == "overall":
            return np.arange(len(slices))
        if "*" in name:
            return np.flatnonzero([fnmatch.fnmatchcase(s, name) for s in slices])
        return np.flatnonzero(slices == name)
