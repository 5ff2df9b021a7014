"""The first release: no production to regress against, so the no-camera baselines are the floor.

Baselines are fitted on the training logs and scored on held-out logs of real fleet frames;
the gate (``compare_with_production`` with ``production=None``) must refuse a candidate that
does not beat them by gates.yaml's margins on every gated slice, and accept one that does.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.evaluation.baselines import (
    fit_baselines,
    fit_baselines_from_labels,
    score_baselines,
)
from aiinfra_pipelines.evaluation.compare import (
    FIRST_RELEASE_NOTE,
    NO_PRODUCTION_NOTE,
    baseline_margin,
    compare_with_production,
    first_release_floors,
)
from aiinfra_pipelines.evaluation.slices import evaluate_by_slice
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.labels import ground_truth_labels

GATES = load_resource_yaml("gates.yaml")


def _split(frames: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every third log held out (a benchmark by log), the rest to fit baselines on."""
    logs = sorted(frames["log_id"].unique())
    held_out = frames["log_id"].isin(logs[::3])
    return frames[~held_out].reset_index(drop=True), frames[held_out].reset_index(drop=True)


def _scores(frames: pd.DataFrame, prob: np.ndarray, gap: np.ndarray) -> pd.DataFrame:
    spec = perception_spec()
    occupancy, lead_gap = ground_truth_labels(frames, spec)
    return evaluate_by_slice(frames, prob, occupancy, gap, lead_gap, spec.max_range_m)


def test_majority_and_mean_gap_are_fitted_per_cell_on_training_labels() -> None:
    occupancy = np.zeros((4, 3, 2), dtype=np.float32)
    occupancy[:3, 0, :] = 1.0  # left lane occupied in 3 of 4 frames
    occupancy[:1, 1, 0] = 1.0  # ego near bin occupied in 1 of 4
    baselines = fit_baselines_from_labels(occupancy, np.array([0.2, 0.4, 0.6, 1.0]))

    assert baselines.majority.tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert baselines.occupied_share[1, 0] == pytest.approx(0.25)
    assert baselines.mean_lead_gap == pytest.approx(0.55)
    with pytest.raises(ValueError, match="non-empty"):
        fit_baselines_from_labels(np.zeros((0, 3, 2)), np.zeros(0))


def test_baselines_score_like_the_metric_functions(labelled_fleet) -> None:
    frames = labelled_fleet[0]
    train, benchmark = _split(frames)
    baselines = fit_baselines(train)
    table = score_baselines(baselines, benchmark).set_index("slice")

    spec = perception_spec()
    occupancy, lead_gap = ground_truth_labels(benchmark, spec)
    # The majority grid with the map's missing lanes filled in, frame by frame.
    guess = np.broadcast_to(baselines.majority, occupancy.shape).copy()
    guess[benchmark["lane_index"].to_numpy() <= 0, 0, :] = 1.0
    last_lane = benchmark["lane_count"].to_numpy() - 1
    guess[benchmark["lane_index"].to_numpy() >= last_lane, 2, :] = 1.0
    correct = (occupancy >= 0.5) == (guess >= 0.5)
    overall = table.loc["overall"]
    assert overall["frames"] == len(benchmark)
    assert overall["occupancy_accuracy"] == pytest.approx(correct.mean())
    expected_mae = np.abs(lead_gap - baselines.mean_lead_gap).mean() * spec.max_range_m
    assert overall["lead_gap_mae_m"] == pytest.approx(expected_mae)
    # The grid is lopsided (missing lanes are occupied, far ego bins mostly free): a constant
    # guess is far better than a coin flip, which is why it is the floor and not 0.5.
    assert overall["occupancy_accuracy"] > 0.6


def test_first_release_below_the_baselines_is_refused_and_above_is_accepted(
    labelled_fleet,
) -> None:
    frames = labelled_fleet[0]
    train, benchmark = _split(frames)
    baselines = fit_baselines(train)
    baseline = score_baselines(baselines, benchmark)
    spec = perception_spec()
    occupancy, lead_gap = ground_truth_labels(benchmark, spec)
    n = len(benchmark)

    # A camera-blind candidate: exactly the baselines' guess. It does not beat them by the margin.
    blind = _scores(
        benchmark,
        np.broadcast_to(baselines.majority, (n, *baselines.majority.shape)),
        np.full(n, baselines.mean_lead_gap),
    )
    refused = compare_with_production(blind, None, GATES, baseline=baseline)
    assert not refused.passed and refused.reference == "baseline"
    assert refused.notes[0] == FIRST_RELEASE_NOTE
    assert any(f.startswith("overall occupancy_accuracy") for f in refused.failures)
    assert any(f.startswith("overall lead_gap_mae_m") for f in refused.failures)
    assert all("no-camera baseline" in f for f in refused.failures)
    assert "(cand / base / Δ)" in refused.to_markdown()

    # A candidate that sees: right on almost every cell, gaps within a metre.
    rng = np.random.default_rng(0)
    prob = np.where(occupancy > 0.5, 0.9, 0.1)
    prob = np.where(rng.random(prob.shape) < 0.01, 1.0 - prob, prob)
    gap = np.clip(lead_gap + rng.normal(0.0, 0.5 / spec.max_range_m, n), 0.0, 1.0)
    accepted = compare_with_production(
        _scores(benchmark, prob, gap), None, GATES, baseline=baseline
    )
    assert accepted.passed, accepted.failures
    gated = accepted.table[accepted.table["gated"]]
    assert set(gated["metric"]) == set(first_release_floors(GATES))
    assert "overall" in set(gated["slice"])
    for row in gated.itertuples():
        assert row.budget == pytest.approx(-baseline_margin(row.metric, row.production, GATES))


def test_first_release_gates_every_slice_not_only_overall(labelled_fleet) -> None:
    """A candidate that is excellent overall but blind on one gated slice is refused there."""
    frames = labelled_fleet[0]
    train, benchmark = _split(frames)
    baselines = fit_baselines(train)
    baseline = score_baselines(baselines, benchmark)
    spec = perception_spec()
    occupancy, lead_gap = ground_truth_labels(benchmark, spec)
    counts = benchmark["slice"].value_counts()
    weak = str(counts.index[0])  # the largest slice: surely above min_slice_frames
    assert counts.iloc[0] >= GATES["offline"]["min_slice_frames"]
    prob = np.where(occupancy > 0.5, 0.9, 0.1)
    gap = lead_gap.copy()
    blind = (benchmark["slice"] == weak).to_numpy()
    prob[blind] = baselines.majority
    gap[blind] = baselines.mean_lead_gap

    comparison = compare_with_production(
        _scores(benchmark, prob, gap), None, GATES, baseline=baseline
    )
    assert not comparison.passed
    assert any(f.startswith(f"{weak} occupancy_accuracy") for f in comparison.failures)
    assert not any(f.startswith("overall ") for f in comparison.failures)


def test_the_margin_shrinks_where_the_constant_guess_is_nearly_perfect() -> None:
    gates = {
        "offline": {
            "first_release": {
                "beat_baseline_by": {"occupancy_accuracy": 0.05, "lead_gap_mae_m": 2.0},
                "max_share_of_baseline_error": 0.25,
            }
        }
    }
    assert baseline_margin("occupancy_accuracy", 0.70, gates) == pytest.approx(0.05)
    assert baseline_margin("occupancy_accuracy", 0.98, gates) == pytest.approx(0.005)
    assert baseline_margin("lead_gap_mae_m", 20.0, gates) == pytest.approx(2.0)
    assert baseline_margin("lead_gap_mae_m", 4.0, gates) == pytest.approx(1.0)
    assert baseline_margin("occupancy_f1", 0.5, gates) is None  # not configured: not gated
    # A near-perfect baseline still has to be beaten, not merely matched.
    candidate = pd.DataFrame(
        [
            {
                "slice": "overall",
                "kind": "overall",
                "frames": 50,
                "occupancy_accuracy": 0.98,
                "occupancy_f1": 0.9,
                "lead_gap_mae_m": 2.5,
            }
        ]
    )
    # MAE 2.5 beats 3.5 by more than min(2.0, 0.25 x 3.5); accuracy 0.98 only matches 0.98.
    baseline = candidate.assign(occupancy_accuracy=0.98, lead_gap_mae_m=3.5)
    refused = compare_with_production(candidate, None, gates, baseline=baseline)
    assert [f.split(":")[0] for f in refused.failures] == ["overall occupancy_accuracy"]
    better = candidate.assign(occupancy_accuracy=0.99)
    assert compare_with_production(better, None, gates, baseline=baseline).passed


def test_without_baselines_or_floors_a_first_release_is_only_reported() -> None:
    candidate = pd.DataFrame(
        [
            {
                "slice": "overall",
                "kind": "overall",
                "frames": 50,
                "occupancy_accuracy": 0.4,
                "occupancy_f1": 0.2,
                "lead_gap_mae_m": 20.0,
            }
        ]
    )
    no_floors = {"offline": {k: v for k, v in GATES["offline"].items() if k != "first_release"}}
    for gates, baseline in ((GATES, None), (no_floors, candidate)):
        comparison = compare_with_production(candidate, None, gates, baseline=baseline)
        assert comparison.passed and comparison.notes == [NO_PRODUCTION_NOTE]
