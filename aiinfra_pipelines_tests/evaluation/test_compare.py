"""The offline gate: per-slice budgets against production from gates.yaml."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.evaluation.compare import (
    NO_PRODUCTION_NOTE,
    budget_for,
    compare_with_production,
)
from aiinfra_pipelines.evaluation.slices import evaluate_by_slice
from aiinfra_pipelines.metadata_tables import escape_markdown

GATES = {
    "offline": {
        "min_slice_frames": 20,
        "budgets": {"occupancy_accuracy": 0.03, "occupancy_f1": 0.05, "lead_gap_mae_m": 2.0},
        "slice_overrides": {"night/*/*": {"lead_gap_mae_m": 2.5}, "*/*/merge": {}},
    }
}


def _table(rows: list[tuple[str, int, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "slice": s,
                "kind": "slice",
                "frames": n,
                "occupancy_accuracy": a,
                "occupancy_f1": f,
                "lead_gap_mae_m": m,
            }
            for s, n, a, f, m in rows
        ]
    )


def _predict(
    occupancy: np.ndarray, lead_gap: np.ndarray, noisy: np.ndarray, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """A model that is confident and right on most frames and guesses on ``noisy`` ones."""
    rng = np.random.default_rng(seed)
    prob = np.where(occupancy > 0.5, 0.9, 0.1).astype(np.float32)
    flips = rng.random(occupancy.shape) < 0.02
    prob = np.where(flips, 1.0 - prob, prob)
    prob[noisy] = rng.random(prob[noisy].shape)
    gap = np.clip(lead_gap + rng.normal(0.0, 0.005, lead_gap.shape), 0.0, 1.0)
    gap[noisy] = rng.random(int(noisy.sum()))
    return prob, gap


def test_night_degraded_candidate_fails_on_night_and_passes_on_day(labelled_fleet) -> None:
    frames, occupancy, lead_gap, max_range = labelled_fleet
    night = (frames["lighting"] == "night").to_numpy()
    nobody = np.zeros(len(frames), dtype=bool)
    prod_prob, prod_gap = _predict(occupancy, lead_gap, nobody, 1)
    cand_prob, cand_gap = _predict(occupancy, lead_gap, night, 7)  # other noise on day, too
    production = evaluate_by_slice(frames, prod_prob, occupancy, prod_gap, lead_gap, max_range)
    candidate = evaluate_by_slice(frames, cand_prob, occupancy, cand_gap, lead_gap, max_range)

    comparison = compare_with_production(candidate, production, load_resource_yaml("gates.yaml"))

    assert not comparison.passed
    night_slices = sorted(frames.loc[night, "slice"].unique())
    day_slices = sorted(frames.loc[~night, "slice"].unique())
    for slice_ in night_slices:
        assert any(f.startswith(f"{slice_} ") for f in comparison.failures), slice_
    assert any(f.startswith("night/*/* occupancy_accuracy") for f in comparison.failures)
    assert not any(f.startswith("day/") for f in comparison.failures)
    table = comparison.table
    day_rows = table.loc[table["slice"].isin(day_slices)]
    assert day_rows["gated"].all() and day_rows["passed"].all()
    failure = next(f for f in comparison.failures if f.startswith(f"{night_slices[0]} "))
    assert "delta -" in failure and "budget 0.030 drop" in failure


def test_budgets_directions_and_overrides() -> None:
    production = _table(
        [
            ("day/clear/highway", 50, 0.90, 0.80, 5.0),
            ("night/clear/highway", 50, 0.90, 0.80, 5.0),
            ("day/clear/merge", 50, 0.90, 0.80, 5.0),
        ]
    )
    candidate = _table(
        [
            ("day/clear/highway", 50, 0.95, 0.90, 7.4),  # better occupancy, MAE +2.4 > 2.0
            ("night/clear/highway", 50, 0.872, 0.76, 7.4),  # within budgets, MAE +2.4 <= 2.5
            ("day/clear/merge", 50, 0.90, 0.70, 3.0),  # F1 -0.10 > 0.05; empty override
        ]
    )
    comparison = compare_with_production(candidate, production, GATES)
    failed = comparison.table.loc[~comparison.table["passed"], ["slice", "metric"]]
    assert sorted(map(tuple, failed.to_numpy())) == [
        ("day/clear/highway", "lead_gap_mae_m"),
        ("day/clear/merge", "occupancy_f1"),
    ]
    assert len(comparison.failures) == 2
    assert any(
        "day/clear/highway lead_gap_mae_m" in f and "budget 2.000 increase" in f
        for f in comparison.failures
    )
    rows = comparison.table.set_index(["slice", "metric"])
    assert rows.loc[("night/clear/highway", "lead_gap_mae_m"), "budget"] == 2.5
    assert rows.loc[("night/clear/highway", "occupancy_accuracy"), "budget"] == 0.03
    assert rows.loc[("day/clear/highway", "occupancy_f1"), "delta"] == pytest.approx(0.10)
    assert rows.loc[("day/clear/highway", "occupancy_f1"), "regression"] == pytest.approx(-0.10)
    assert rows.loc[("day/clear/merge", "lead_gap_mae_m"), "regression"] == pytest.approx(-2.0)
    assert budget_for("night/fog/merge", "occupancy_f1", GATES["offline"]) == 0.05


def test_small_slices_are_reported_but_not_gated() -> None:
    production = _table(
        [("day/clear/highway", 50, 0.9, 0.8, 5.0), ("day/fog/merge", 5, 0.9, 0.8, 5.0)]
    )
    candidate = _table(
        [("day/clear/highway", 50, 0.9, 0.8, 5.0), ("day/fog/merge", 5, 0.2, 0.1, 40.0)]
    )
    comparison = compare_with_production(candidate, production, GATES)

    assert comparison.passed and comparison.failures == []
    small = comparison.table.loc[comparison.table["slice"] == "day/fog/merge"]
    assert len(small) == 3
    assert not small["gated"].any() and small["passed"].all()
    assert small["delta"].tolist() == pytest.approx([-0.7, -0.7, 35.0])
    assert any("below 20 frames" in note for note in comparison.notes)
    assert "| day/fog/merge | 5 |" in comparison.to_markdown()
    assert "not gated" in comparison.to_markdown()


def test_no_production_passes_and_reports_candidate_metrics() -> None:
    candidate = _table(
        [("day/clear/highway", 50, 0.4, 0.3, 9.0), ("night/fog/merge", 30, 0.5, 0.2, 8.0)]
    )
    comparison = compare_with_production(candidate, None, GATES)

    assert comparison.passed and not comparison.has_production
    assert comparison.notes == [NO_PRODUCTION_NOTE]
    assert len(comparison.table) == 6
    assert not comparison.table["gated"].any()
    assert comparison.table["candidate"].tolist() == [0.4, 0.3, 9.0, 0.5, 0.2, 8.0]
    assert comparison.table["production"].isna().all()
    markdown = comparison.to_markdown()
    assert "PASSED" in markdown and "no production model yet" in markdown
    assert "0.400 / n/a / n/a" in markdown


def test_a_slice_missing_from_the_candidate_fails() -> None:
    production = _table(
        [("day/clear/highway", 50, 0.9, 0.8, 5.0), ("night/fog/merge", 30, 0.9, 0.8, 5.0)]
    )
    candidate = _table([("day/clear/highway", 50, 0.9, 0.8, 5.0)])
    comparison = compare_with_production(candidate, production, GATES)
    assert not comparison.passed
    assert all(
        f.startswith("night/fog/merge") and "not evaluated" in f for f in comparison.failures
    )
    assert len(comparison.failures) == 3


def test_markdown_lists_every_slice_with_its_status(labelled_fleet) -> None:
    frames, occupancy, lead_gap, max_range = labelled_fleet
    night = (frames["lighting"] == "night").to_numpy()
    prod = _predict(occupancy, lead_gap, np.zeros(len(frames), dtype=bool), 2)
    cand = _predict(occupancy, lead_gap, night, 2)
    production = evaluate_by_slice(frames, prod[0], occupancy, prod[1], lead_gap, max_range)
    candidate = evaluate_by_slice(frames, cand[0], occupancy, cand[1], lead_gap, max_range)
    comparison = compare_with_production(candidate, production, GATES)

    markdown = comparison.to_markdown()
    assert markdown.startswith("**Offline gate: FAILED**")
    table_lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert len(table_lines) == 1 + candidate["slice"].nunique()  # header + one per row
    for slice_ in candidate["slice"]:
        # escaped: "day/*/*" shows as written, not as emphasis ("day//")
        assert any(line.startswith(f"| {escape_markdown(slice_)} |") for line in table_lines)
    # Day-only rows pass; night rows fail (aggregates mixing both fail through their night part).
    for slice_ in [*candidate.loc[candidate["kind"] == "slice", "slice"], "day/*/*", "night/*/*"]:
        shown = escape_markdown(slice_)
        line = next(line for line in table_lines if line.startswith(f"| {shown} |"))
        expected = "**FAIL**" if slice_.startswith("night") else "pass"
        assert line.endswith(f"| {expected} |"), line
    summary = comparison.summary()
    assert summary["passed"] is False and summary["failures"] == len(comparison.failures)
    assert summary["slices"] == candidate["slice"].nunique()
    assert not math.isnan(comparison.table["delta"].iloc[0])


# -- beyond chance: per-frame evidence (gates.yaml offline.significance) ------------------------
def _paired(labelled_fleet, noisy_cand, noisy_prod, seeds=(1, 7)):
    from aiinfra_pipelines.evaluation.frame_scores import FrameScores, PairedFrames

    frames, occupancy, lead_gap, max_range = labelled_fleet
    tables, scores = [], []
    for noisy, seed in ((noisy_cand, seeds[1]), (noisy_prod, seeds[0])):
        prob, gap = _predict(occupancy, lead_gap, noisy, seed)
        tables.append(evaluate_by_slice(frames, prob, occupancy, gap, lead_gap, max_range))
        scores.append(FrameScores.of(prob, occupancy, gap, lead_gap, max_range))
    evidence = PairedFrames(frames["slice"].astype(str).to_numpy(), scores[0], scores[1])
    return tables[0], tables[1], evidence


def test_with_per_frame_evidence_a_regression_over_budget_fails_only_beyond_chance(
    labelled_fleet,
) -> None:
    """A candidate guessing on every night frame fails night, beyond chance, and names the
    p-value; one guessing on three frames of a 29-frame slice moves that slice's lead-gap MAE
    over its 2 m budget — the budgets alone refuse it — but within the slice's noise, so with
    the per-frame evidence it passes."""
    frames, *_ = labelled_fleet
    gates = load_resource_yaml("gates.yaml")
    night = (frames["lighting"] == "night").to_numpy()
    nobody = np.zeros(len(frames), dtype=bool)
    candidate, production, evidence = _paired(labelled_fleet, night, nobody)
    comparison = compare_with_production(candidate, production, gates, evidence=evidence)
    assert not comparison.passed
    assert all("beyond chance: p = " in f for f in comparison.failures)
    assert any(f.startswith("night/*/*") for f in comparison.failures)
    gated = comparison.table[comparison.table["gated"]]
    assert gated["p_value"].notna().all() and gated["level"].notna().all()
    assert any("Holm over" in note for note in comparison.notes)

    small = "day/fog/merge"
    assert (frames["slice"] == small).sum() == 29
    three = np.zeros(len(frames), dtype=bool)
    three[np.flatnonzero((frames["slice"] == small).to_numpy())[:3]] = True
    candidate, production, evidence = _paired(labelled_fleet, three, nobody, seeds=(1, 1))
    thresholds = compare_with_production(candidate, production, gates)
    over = thresholds.table[~thresholds.table["passed"]]
    assert set(over["slice"]) == {small, "*/*/merge"}, thresholds.failures  # the only merge slice
    with_evidence = compare_with_production(candidate, production, gates, evidence=evidence)
    assert with_evidence.passed, with_evidence.failures
    rows = with_evidence.table.set_index(["slice", "metric"])
    for row in over.itertuples():
        judged = rows.loc[(row.slice, row.metric)]
        assert judged["regression"] > judged["budget"]  # over budget ...
        assert judged["p_value"] > judged["level"]  # ... within chance
