"""Perception metrics as pure numpy functions.

Training (validation every epoch), offline evaluation (per scenario slice) and the quantization
parity checks must report the *same* numbers for the same predictions, so the definitions live
here once, free of torch, Lightning and configuration: callers pass arrays and thresholds.

Conventions: ``prob`` and ``target`` are occupancy grids of any matching shape (typically
N x 3 lanes x bins); a cell is predicted occupied when ``prob >= threshold`` and is truly
occupied when ``target >= 0.5`` (labels are 0/1). Lead gaps are normalized to the sensing
range (0..1) as the network outputs them; the error is reported in metres.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "lead_gap_mae_m",
    "lead_gap_mean_baseline_mae_m",
    "occupancy_accuracy",
    "occupancy_confusion",
    "occupancy_f1",
    "occupancy_majority_baseline_accuracy",
]


def _paired(prob: np.ndarray, target: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    prob = np.asarray(prob, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    if prob.shape != target.shape:
        raise ValueError(f"{what}: prediction shape {prob.shape} != target shape {target.shape}")
    if prob.size == 0:
        raise ValueError(f"{what}: no values to score (empty arrays)")
    if not (np.all(np.isfinite(prob)) and np.all(np.isfinite(target))):
        raise ValueError(f"{what}: predictions or targets contain NaN/inf")
    return prob, target


def occupancy_confusion(
    prob: np.ndarray, target: np.ndarray, threshold: float = 0.5
) -> dict[str, int]:
    """Cell counts ``tp``, ``fp``, ``fn``, ``tn`` (positive = occupied).

    Exposed so an evaluator that streams batches can sum counts and derive accuracy/F1 once,
    which is exact, whereas averaging per-batch F1 values is not.
    """
    prob, target = _paired(prob, target, "occupancy_confusion")
    predicted = prob >= threshold
    actual = target >= 0.5
    return {
        "tp": int(np.count_nonzero(predicted & actual)),
        "fp": int(np.count_nonzero(predicted & ~actual)),
        "fn": int(np.count_nonzero(~predicted & actual)),
        "tn": int(np.count_nonzero(~predicted & ~actual)),
    }


def occupancy_accuracy(prob: np.ndarray, target: np.ndarray, threshold: float = 0.5) -> float:
    """Fraction of grid cells whose thresholded prediction matches the label."""
    counts = occupancy_confusion(prob, target, threshold)
    return (counts["tp"] + counts["tn"]) / sum(counts.values())


def occupancy_f1(prob: np.ndarray, target: np.ndarray, threshold: float = 0.5) -> float:
    """F1 of the "occupied" class over all cells (micro-averaged).

    Accuracy alone flatters a model on sparse grids (most ego-lane cells are free); F1 drops as
    soon as cars are missed or hallucinated. With no occupied cell in either prediction or label
    there is nothing to get wrong and the score is 1.0.
    """
    counts = occupancy_confusion(prob, target, threshold)
    denominator = 2 * counts["tp"] + counts["fp"] + counts["fn"]
    return 1.0 if denominator == 0 else 2 * counts["tp"] / denominator


def lead_gap_mae_m(pred_norm: np.ndarray, target_norm: np.ndarray, max_range: float) -> float:
    """Mean absolute lead-gap error in metres; gaps are normalized by ``max_range`` (metres).

    Shapes N and N x 1 are both accepted (the network emits N x 1, labels are N).
    """
    if not max_range > 0:
        raise ValueError(f"lead_gap_mae_m: max_range must be > 0, got {max_range}")
    pred = np.asarray(pred_norm, dtype=np.float64).reshape(-1)
    target = np.asarray(target_norm, dtype=np.float64).reshape(-1)
    pred, target = _paired(pred, target, "lead_gap_mae_m")
    return float(np.mean(np.abs(pred - target)) * max_range)


def occupancy_majority_baseline_accuracy(target: np.ndarray, per_cell: bool = True) -> float:
    """Accuracy of the best constant predictor, computed on ``target`` itself (N x ...).

    ``per_cell=True`` picks the majority value of every (lane, bin) cell separately — a strong
    baseline, because missing lanes are labelled fully occupied and the ego lane is mostly free;
    ``per_cell=False`` predicts one majority value for all cells. A model is only useful if it
    beats these: they need no camera at all.
    """
    target = np.asarray(target, dtype=np.float64) >= 0.5
    if target.size == 0:
        raise ValueError("occupancy_majority_baseline_accuracy: no values (empty array)")
    occupied_share = target.mean(axis=0) if per_cell else target.mean()
    return float(np.mean(np.maximum(occupied_share, 1.0 - occupied_share)))


def lead_gap_mean_baseline_mae_m(target_norm: np.ndarray, max_range: float) -> float:
    """MAE (metres) of always predicting the mean lead gap of ``target_norm`` itself."""
    target = np.asarray(target_norm, dtype=np.float64).reshape(-1)
    return lead_gap_mae_m(np.full_like(target, target.mean()), target, max_range)
