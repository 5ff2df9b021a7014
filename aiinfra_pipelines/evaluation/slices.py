"""Metrics per scenario slice (lighting × weather × road type), per condition and overall.

One table answers "where is the model weak": a row per slice (``night/rain/highway``), a row per
condition value across slices (``night/*/*``, ``*/rain/*``, ``*/*/highway``) and ``overall``.
Condition rows are named as fnmatch patterns on purpose: the per-slice budget overrides in
gates.yaml (``"night/*/*"``) then apply to them too, and an aggregate has enough frames to be
gated even when each of its slices is too small on its own.

The metric definitions are ``aiinfra_pipelines.training.metrics`` (pure numpy), so offline
evaluation reports exactly the numbers training validation does.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from aiinfra_pipelines.training.metrics import lead_gap_mae_m, occupancy_accuracy, occupancy_f1

DIMENSIONS: tuple[str, ...] = ("lighting", "weather", "road_type")
METRIC_COLUMNS: tuple[str, ...] = ("occupancy_accuracy", "occupancy_f1", "lead_gap_mae_m")
OVERALL = "overall"
KIND_SLICE = "slice"
KIND_OVERALL = "overall"


def condition_row_name(dimension: str, value: str) -> str:
    """The aggregate row name for one condition value, e.g. ``("weather", "rain") → */rain/*``."""
    parts = ["*"] * len(DIMENSIONS)
    parts[DIMENSIONS.index(dimension)] = str(value)
    return "/".join(parts)


def evaluate_by_slice(
    frames: pd.DataFrame,
    occupancy_prob: np.ndarray,
    occupancy_target: np.ndarray,
    lead_gap_pred_norm: np.ndarray,
    lead_gap_target_norm: np.ndarray,
    max_range: float,
    *,
    threshold: float = 0.5,
    include_conditions: bool = True,
) -> pd.DataFrame:
    """One row per slice, per condition value (if ``include_conditions``) and ``overall``.

    ``frames`` needs a ``slice`` column (``lighting/weather/road_type``) and is aligned by
    position with the arrays (occupancy N × 3 × bins, lead gaps N or N × 1, normalized by
    ``max_range``). Columns: ``slice``, ``kind`` (``slice``, a dimension name, or ``overall``),
    ``frames``, ``occupancy_accuracy``, ``occupancy_f1``, ``lead_gap_mae_m``.
    """
    if "slice" not in frames.columns:
        raise ValueError("evaluate_by_slice needs a 'slice' column")
    prob = np.asarray(occupancy_prob)
    target = np.asarray(occupancy_target)
    gap_pred = np.asarray(lead_gap_pred_norm).reshape(-1)
    gap_target = np.asarray(lead_gap_target_norm).reshape(-1)
    lengths = {len(frames), len(prob), len(target), len(gap_pred), len(gap_target)}
    if len(lengths) != 1:
        raise ValueError(
            f"frames and predictions are not aligned: frames {len(frames)}, prob {len(prob)}, "
            f"target {len(target)}, gap pred {len(gap_pred)}, gap target {len(gap_target)}"
        )
    slices = frames["slice"].astype(str).to_numpy()

    def row(name: str, kind: str, mask: np.ndarray) -> dict[str, object]:
        n = int(mask.sum())
        if n == 0:  # nothing measured (an empty benchmark): NaN, never a flattering 0 or 1
            scores = dict.fromkeys(METRIC_COLUMNS, float("nan"))
        else:
            scores = {
                "occupancy_accuracy": occupancy_accuracy(prob[mask], target[mask], threshold),
                "occupancy_f1": occupancy_f1(prob[mask], target[mask], threshold),
                "lead_gap_mae_m": lead_gap_mae_m(gap_pred[mask], gap_target[mask], max_range),
            }
        return {"slice": name, "kind": kind, "frames": n, **scores}

    rows = [row(name, KIND_SLICE, slices == name) for name in sorted(set(slices))]
    if include_conditions and len(slices):
        parts = np.array([name.split("/") for name in slices], dtype=object)
        if parts.ndim == 2 and parts.shape[1] == len(DIMENSIONS):
            for index, dimension in enumerate(DIMENSIONS):
                for value in sorted(set(parts[:, index])):
                    mask = parts[:, index] == value
                    rows.append(row(condition_row_name(dimension, value), dimension, mask))
    rows.append(row(OVERALL, KIND_OVERALL, np.ones(len(slices), dtype=bool)))
    return pd.DataFrame(rows, columns=["slice", "kind", "frames", *METRIC_COLUMNS])
