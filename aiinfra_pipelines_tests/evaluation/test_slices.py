"""Per-slice metrics against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.evaluation.slices import METRIC_COLUMNS, evaluate_by_slice

DAY, NIGHT = "day/clear/highway", "night/rain/highway"


def _case() -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """4 frames, 3 lanes × 2 bins; frames 0-1 day, 2-3 night."""
    frames = pd.DataFrame({"slice": [DAY, DAY, NIGHT, NIGHT]})
    target = np.zeros((4, 3, 2), dtype=np.float32)
    target[0, 1, 0] = 1  # one car ahead in ego lane
    target[1, 0, 1] = 1
    target[2, 2, 0] = 1
    target[3, 1, 1] = 1
    prob = np.full((4, 3, 2), 0.1, dtype=np.float32)
    prob[0, 1, 0] = 0.9  # day frame 0: perfect
    prob[1, 0, 1] = 0.8  # day frame 1: hit + one false positive
    prob[1, 2, 0] = 0.7
    prob[2, 2, 0] = 0.4  # night frame 2: miss
    prob[3, 1, 1] = 0.6  # night frame 3: hit + false positive
    prob[3, 0, 0] = 0.55
    gap_target = np.array([0.2, 0.4, 0.5, 1.0])
    gap_pred = np.array([0.2, 0.5, 0.3, 0.9])
    return frames, prob, target, gap_pred, gap_target


def test_slice_metrics_equal_hand_computed_values() -> None:
    frames, prob, target, gap_pred, gap_target = _case()
    table = evaluate_by_slice(frames, prob, target, gap_pred, gap_target, max_range=75.0)
    rows = table.set_index("slice")

    # Day: 12 cells, 1 wrong (FP) → 11/12; TP=2 FP=1 FN=0 → F1 = 4/5; gaps |0|,|0.1| × 75 / 2.
    assert rows.loc[DAY, "frames"] == 2
    assert rows.loc[DAY, "occupancy_accuracy"] == pytest.approx(11 / 12)
    assert rows.loc[DAY, "occupancy_f1"] == pytest.approx(4 / 5)
    assert rows.loc[DAY, "lead_gap_mae_m"] == pytest.approx(3.75)
    # Night: FN + FP → 10/12; TP=1 FP=1 FN=1 → F1 = 2/4; gaps 0.2, 0.1 → 0.15 × 75.
    assert rows.loc[NIGHT, "occupancy_accuracy"] == pytest.approx(10 / 12)
    assert rows.loc[NIGHT, "occupancy_f1"] == pytest.approx(0.5)
    assert rows.loc[NIGHT, "lead_gap_mae_m"] == pytest.approx(11.25)
    # Overall: 21/24; TP=3 FP=2 FN=1 → 6/9; mean gap error 0.1 × 75.
    assert rows.loc["overall", "frames"] == 4
    assert rows.loc["overall", "occupancy_accuracy"] == pytest.approx(21 / 24)
    assert rows.loc["overall", "occupancy_f1"] == pytest.approx(6 / 9)
    assert rows.loc["overall", "lead_gap_mae_m"] == pytest.approx(7.5)


def test_condition_rows_aggregate_across_slices() -> None:
    frames, prob, target, gap_pred, gap_target = _case()
    table = evaluate_by_slice(frames, prob, target, gap_pred, gap_target, max_range=75.0)
    rows = table.set_index("slice")

    assert table["slice"].tolist() == [
        DAY,
        NIGHT,
        "day/*/*",
        "night/*/*",
        "*/clear/*",
        "*/rain/*",
        "*/*/highway",
        "overall",
    ]
    assert rows.loc["night/*/*", "kind"] == "lighting"
    assert rows.loc["*/*/highway", "kind"] == "road_type"
    metrics = ["frames", "occupancy_accuracy", "occupancy_f1", "lead_gap_mae_m"]
    assert rows.loc["night/*/*", metrics].tolist() == rows.loc[NIGHT, metrics].tolist()
    assert rows.loc["*/*/highway", metrics].tolist() == rows.loc["overall", metrics].tolist()

    plain = evaluate_by_slice(
        frames, prob, target, gap_pred, gap_target, max_range=75.0, include_conditions=False
    )
    assert plain["slice"].tolist() == [DAY, NIGHT, "overall"]


def test_lead_gap_accepts_column_vectors_and_misalignment_is_refused() -> None:
    frames, prob, target, gap_pred, gap_target = _case()
    table = evaluate_by_slice(frames, prob, target, gap_pred[:, None], gap_target, max_range=75.0)
    assert table.set_index("slice").loc["overall", "lead_gap_mae_m"] == pytest.approx(7.5)
    with pytest.raises(ValueError, match="not aligned"):
        evaluate_by_slice(frames.iloc[:3], prob, target, gap_pred, gap_target, max_range=75.0)
    with pytest.raises(ValueError, match="slice"):
        evaluate_by_slice(
            frames.rename(columns={"slice": "s"}),
            prob,
            target,
            gap_pred,
            gap_target,
            max_range=75.0,
        )


def test_empty_benchmark_gives_nan_not_a_score() -> None:
    table = evaluate_by_slice(
        pd.DataFrame({"slice": pd.Series([], dtype=str)}),
        np.zeros((0, 3, 2)),
        np.zeros((0, 3, 2)),
        np.zeros(0),
        np.zeros(0),
        max_range=75.0,
    )
    assert table["slice"].tolist() == ["overall"]
    assert table.loc[0, "frames"] == 0
    assert all(math.isnan(table.loc[0, m]) for m in METRIC_COLUMNS)
