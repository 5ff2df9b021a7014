"""Cohort telemetry for stage decisions: aggregate each cohort, compare against the budgets.

Pure functions over the operations layer's telemetry records, apart from any lake or state,
so the numbers a stage decision rests on can be tested (and recomputed) on their own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .rollout_state import RolloutState
from .shadow import psi

PRE_RELEASE_ENGINE_SHA = ""  # what telemetry reports for the stack that predates any engine


@dataclass(frozen=True)
class CohortMetrics:
    """One cohort's telemetry over a stage window (rates per 1000 frames, shares per frame)."""

    vehicles: int
    records: int
    frames: int
    collisions: int
    near_misses: int
    fallback_frames: int
    collision_rate_per_1k_frames: float
    near_miss_rate_per_1k_frames: float
    fallback_rate: float
    latency_p95_ms: float
    confidence_mean: float
    confidence_histogram: list[int] = field(default_factory=list)
    # Of the collisions, those ego caused (fleet.safety_events): the rollout's safety event.
    at_fault_collisions: int = 0
    at_fault_rate_per_1k_frames: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def event_counts(records: pd.DataFrame, column: str) -> pd.Series:
    """Per-record counts of one safety event. Records from before the car classified fault
    (no ``at_fault_collisions``) count every collision at fault: the cautious reading."""
    if column == "at_fault_collisions":
        if column not in records:
            return records["collisions"]
        return records[column].fillna(records["collisions"])
    return records[column]


def cohort_metrics(records: pd.DataFrame) -> CohortMetrics:
    """Aggregate telemetry records (the operations layer's schema) of one cohort.

    Latency is the frame-weighted mean of the vehicles' own p95 (percentiles cannot be merged
    exactly; this is the p95 a typical frame's vehicle saw). Confidence comes from the merged
    histograms, valued at the bin centres.
    """
    if records.empty:
        return CohortMetrics(0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, [])
    frames = int(records["frames"].sum())
    per_1k = 1000.0 / frames if frames else 0.0
    at_fault_count = int(event_counts(records, "at_fault_collisions").sum())
    histogram = np.sum(
        np.stack([np.asarray(h, dtype=np.int64) for h in records["confidence_histogram"]]), axis=0
    )
    centres = (np.arange(len(histogram)) + 0.5) / len(histogram)
    weights = records["frames"].to_numpy(dtype=float)
    return CohortMetrics(
        vehicles=int(records["vehicle_pseudonym"].nunique()),
        records=len(records),
        frames=frames,
        collisions=int(records["collisions"].sum()),
        near_misses=int(records["near_misses"].sum()),
        fallback_frames=int(records["fallback_frames"].sum()),
        collision_rate_per_1k_frames=float(records["collisions"].sum() * per_1k),
        near_miss_rate_per_1k_frames=float(records["near_misses"].sum() * per_1k),
        fallback_rate=float(records["fallback_frames"].sum() / frames) if frames else 0.0,
        latency_p95_ms=(
            float(np.average(records["latency_ms_p95"].to_numpy(float), weights=weights))
            if frames
            else 0.0
        ),
        confidence_mean=(
            float(np.sum(histogram * centres) / histogram.sum()) if histogram.sum() else 0.0
        ),
        confidence_histogram=[int(count) for count in histogram],
        at_fault_collisions=at_fault_count,
        at_fault_rate_per_1k_frames=float(at_fault_count * per_1k),
    )


def control_mask(state: RolloutState, engine_sha256: pd.Series) -> pd.Series:
    """Records of the control cohort: the cars running what production is.

    Before the first release no car runs an engine at all — the fleet drives the previous
    stack (the rule planner on its own sensors), whose telemetry carries no engine hash. Model
    zero is production only on paper (mining's engine), so the cars without an engine are the
    control then; afterwards it is the production engine's hash.
    """
    if state.previous_production is None:
        return engine_sha256.isin([state.production_engine_sha256, PRE_RELEASE_ENGINE_SHA])
    return engine_sha256 == state.production_engine_sha256


def cohort_records(state: RolloutState, records: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(candidate, control) records, split by the engine each vehicle actually ran; vehicles
    on neither engine (not yet updated) are ignored."""
    if records.empty:
        return records, records
    engine = records["engine_sha256"]
    return records[engine == state.engine_sha256], records[control_mask(state, engine)]


def split_cohorts(
    state: RolloutState, records: pd.DataFrame
) -> tuple[CohortMetrics, CohortMetrics]:
    """(candidate, control) metrics of :func:`cohort_records`."""
    candidate, control = cohort_records(state, records)
    return cohort_metrics(candidate), cohort_metrics(control)


@dataclass(frozen=True)
class Breach:
    metric: str
    candidate: float
    control: float
    budget: float

    @property
    def message(self) -> str:
        if self.metric == "confidence_mean_drop":
            return (
                f"mean confidence {self.candidate:.3f} vs control {self.control:.3f}: drop "
                f"{self.control - self.candidate:.3f} > budget {self.budget}"
            )
        return (
            f"{self.metric} {self.candidate:.4g} vs control {self.control:.4g}: increase "
            f"{self.candidate - self.control:.4g} > budget {self.budget}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "message": self.message}


def confidence_psi(candidate: CohortMetrics, control: CohortMetrics) -> float | None:
    """PSI of the two cohorts' confidence histograms (reported, not gated); None if empty."""
    if not candidate.confidence_histogram or not control.confidence_histogram:
        return None
    if sum(candidate.confidence_histogram) == 0 or sum(control.confidence_histogram) == 0:
        return None
    return psi(np.asarray(control.confidence_histogram), np.asarray(candidate.confidence_histogram))
