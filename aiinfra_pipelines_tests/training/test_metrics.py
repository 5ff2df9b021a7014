"""The pure metric functions evaluation shares with training: hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from aiinfra_pipelines.training import metrics


def test_accuracy_and_f1_on_a_hand_counted_grid():
    # 2 frames x 1 lane x 4 bins: tp=2, fp=1, fn=1, tn=4.
    target = np.array([[[1, 1, 0, 0]], [[1, 0, 0, 0]]], dtype=np.float32)
    prob = np.array([[[0.9, 0.2, 0.7, 0.1]], [[0.5, 0.0, 0.3, 0.4]]], dtype=np.float32)

    assert metrics.occupancy_confusion(prob, target) == {"tp": 2, "fp": 1, "fn": 1, "tn": 4}
    assert metrics.occupancy_accuracy(prob, target) == pytest.approx(6 / 8)
    assert metrics.occupancy_f1(prob, target) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    # A stricter threshold turns the 0.5 and 0.7 cells negative: tp=1, fp=0, fn=2, tn=5.
    assert metrics.occupancy_accuracy(prob, target, threshold=0.8) == pytest.approx(6 / 8)
    assert metrics.occupancy_f1(prob, target, threshold=0.8) == pytest.approx(2 / 4)


def test_f1_is_perfect_only_when_nothing_is_occupied_on_either_side():
    empty = np.zeros((3, 3, 6))
    assert metrics.occupancy_f1(empty, empty) == 1.0
    hallucinated = empty.copy()
    hallucinated[0, 0, 0] = 0.9
    assert metrics.occupancy_f1(hallucinated, empty) == 0.0


def test_lead_gap_mae_is_in_metres_and_accepts_network_shape():
    pred = np.array([[0.5], [1.0]])  # N x 1, as the network emits
    target = np.array([0.4, 0.8])  # N, as the labels are
    assert metrics.lead_gap_mae_m(pred, target, max_range=75.0) == pytest.approx(0.15 * 75.0)


def test_baselines_are_the_best_constant_predictors():
    # Cell (0, 0) is occupied in 4 of 4 frames, cell (0, 1) in 1 of 4: 5 of 8 cells overall.
    target = np.array([[[1, 0]], [[1, 0]], [[1, 1]], [[1, 0]]], dtype=np.float32)
    assert metrics.occupancy_majority_baseline_accuracy(target) == pytest.approx((1 + 0.75) / 2)
    assert metrics.occupancy_majority_baseline_accuracy(target, per_cell=False) == pytest.approx(
        5 / 8
    )
    gaps = np.array([0.0, 1.0])
    assert metrics.lead_gap_mean_baseline_mae_m(gaps, max_range=10.0) == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("prob", "target", "message"),
    [
        (np.zeros((2, 3, 6)), np.zeros((2, 3, 5)), "shape"),
        (np.zeros((0, 3, 6)), np.zeros((0, 3, 6)), "empty"),
        (np.full((1, 3, 6), np.nan), np.zeros((1, 3, 6)), "NaN"),
    ],
)
def test_bad_arrays_are_refused_with_the_reason(prob, target, message):
    with pytest.raises(ValueError, match=message):
        metrics.occupancy_accuracy(prob, target)
