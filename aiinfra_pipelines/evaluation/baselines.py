"""No-camera baselines: what a model must beat before it is worth a first release.

A perception model that cannot beat a constant guess has learned nothing from the camera. Two
such guesses, both fitted on the *training* split (never on the benchmark, which would flatter
them with knowledge of the answers) and scored on the benchmark per slice like any candidate:

* **per-cell majority**: every (lane, distance bin) cell predicted as its most frequent training
  label, then the map's missing lanes filled in like any model's output
  (``fleet.perception.fill_missing_lanes``). Strong on this grid, because far ego-lane bins are
  mostly free and the map knows where there is no lane: a useless model reaches ~0.75.
* **mean gap**: the lead gap predicted as the training set's mean gap.

The offline gate holds a first candidate to beating both by a margin on every gated slice
(``gates.yaml`` ``offline.first_release``, see ``compare.compare_with_production``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from aiinfra_pipelines.fleet.perception import fill_missing_lanes
from aiinfra_pipelines.perception.contract import PerceptionSpec, perception_spec
from aiinfra_pipelines.perception.labels import ground_truth_labels

from .frame_scores import FrameScores
from .slices import evaluate_by_slice


@dataclass(frozen=True)
class Baselines:
    """The constant predictions fitted on training labels."""

    occupied_share: np.ndarray  # 3 x bins: share of training frames with the cell occupied
    mean_lead_gap: float  # normalized by the sensing range, like the network's output
    frames: int  # training frames they were fitted on

    @property
    def majority(self) -> np.ndarray:
        """3 x bins of 0/1: each cell's majority label (ties count as occupied)."""
        return (self.occupied_share >= 0.5).astype(np.float32)


def fit_baselines_from_labels(occupancy: np.ndarray, lead_gap: np.ndarray) -> Baselines:
    """Baselines from label arrays (occupancy N x 3 x bins in {0,1}, lead gap N normalized)."""
    occupancy = np.asarray(occupancy, dtype=np.float64)
    lead_gap = np.asarray(lead_gap, dtype=np.float64).reshape(-1)
    if len(occupancy) == 0 or len(occupancy) != len(lead_gap):
        raise ValueError(
            f"baselines need aligned, non-empty labels: {len(occupancy)} grids, "
            f"{len(lead_gap)} gaps"
        )
    return Baselines(
        occupied_share=(occupancy >= 0.5).mean(axis=0),
        mean_lead_gap=float(lead_gap.mean()),
        frames=len(occupancy),
    )


def fit_baselines(train_frames: pd.DataFrame, spec: PerceptionSpec | None = None) -> Baselines:
    """Baselines from a training frames table's ground-truth labels."""
    occupancy, lead_gap = ground_truth_labels(train_frames, spec or perception_spec())
    return fit_baselines_from_labels(occupancy, lead_gap)


def score_baselines(
    baselines: Baselines, frames: pd.DataFrame, spec: PerceptionSpec | None = None
) -> pd.DataFrame:
    """The baselines' ``evaluate_by_slice`` table on ``frames`` (the benchmark)."""
    return scored_baselines(baselines, frames, spec)[0]


def scored_baselines(
    baselines: Baselines, frames: pd.DataFrame, spec: PerceptionSpec | None = None
) -> tuple[pd.DataFrame, FrameScores]:
    """(``evaluate_by_slice`` table, per-frame scores) of the baselines on ``frames``."""
    spec = spec or perception_spec()
    occupancy_target, gap_target = ground_truth_labels(frames, spec)
    n = len(frames)
    occupancy = fill_missing_lanes(
        np.broadcast_to(baselines.majority, (n, *baselines.majority.shape)),
        frames["lane_index"].to_numpy(),
        frames["lane_count"].to_numpy(),
    )
    gap = np.full(n, baselines.mean_lead_gap, dtype=np.float64)
    table = evaluate_by_slice(
        frames, occupancy, occupancy_target, gap, gap_target, spec.max_range_m
    )
    scores = FrameScores.of(occupancy, occupancy_target, gap, gap_target, spec.max_range_m)
    return table, scores
