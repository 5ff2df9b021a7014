"""The staged rollout's error rates, measured through its own decision code.

Simulated telemetry streams — a fleet whose cars each send one record per batch, the control
cohort at gates.yaml's stated event rates, the candidate cohort equal to it or with twice its
at-fault rate — are pushed through :func:`~.rollout_evaluation.evaluate_stage` exactly as the
rollout asset calls it: publish by publish, each stage judged on the telemetry since it began,
widening on ``advance`` until the stage that needs a person's approval. A trial ends when the
rollout is rolled back, reaches the approval stage, or a stage passes its exposure cap
undecided (``stalled``: the operator would decide).

Per-vehicle figures (fallback share, latency p95, confidence) are drawn alike for both cohorts,
so the rates measured are those of the safety-event tests with the budget tests running beside
them (their false alarms count as false rollbacks too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.config import settings_section

from .rollout import new_rollout_state, start_rollout
from .rollout_evaluation import evaluate_stage
from .rollout_settings import RolloutSettings
from .rollout_state import AWAITING_APPROVAL, ROLLED_BACK, RolloutState

CANDIDATE_SHA, PRODUCTION_SHA = "c" * 64, "b" * 64
PRODUCTION_POINTER = {
    "version": "1",
    "onnx_key": "candidates/1/int8.onnx",
    "engine_sha256": PRODUCTION_SHA,
    "commit": "m0",
    "model_uri": "runs:/r1/model",
}
CONFIDENCE_BINS = 10


@dataclass(frozen=True)
class FleetModel:
    """The simulated fleet (gates.yaml ``release.rollout.calibration``)."""

    vehicles: int
    frames_per_batch: int  # frames each car sends per telemetry batch
    max_batches: int  # a stage that never decides stops here as well as at its cap

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> FleetModel:
        section = settings_section("gates.yaml", "release.rollout.calibration", config)
        return cls(
            section.int("vehicles"), section.int("frames_per_batch"), section.int("max_batches")
        )


def stated_targets(config: Mapping[str, Any] | None = None) -> dict[str, tuple[str, float]]:
    """``{figure: (">=" or "<=", target)}`` as gates.yaml states them."""
    section = settings_section("gates.yaml", "release.rollout.calibration.targets", config)
    targets: dict[str, tuple[str, float]] = {}
    for name, value in section.values.items():
        if name.endswith("_max"):
            targets[name.removesuffix("_max")] = ("<=", float(value))
        elif name.endswith("_min"):
            targets[name.removesuffix("_min")] = (">=", float(value))
        else:
            raise section.error(name, "a target name ends in _min or _max")
    return targets


def _started(settings: RolloutSettings) -> RolloutState:
    state = new_rollout_state(
        "2",
        CANDIDATE_SHA,
        engine_key="candidates/2/int8.onnx",
        model_uri="runs:/r2/model",
        production=PRODUCTION_POINTER,
        production_engine_sha256=PRODUCTION_SHA,
        shadow={"passed": True, "frames": 1000, "decision_agreement": 0.9, "reasons": []},
        at="t0",
    )
    state, decision = start_rollout(
        state,
        settings,
        telemetry_commit="T0",
        production=PRODUCTION_POINTER,
        production_engine_sha256=PRODUCTION_SHA,
        active_rollout=None,
        at="t0",
    )
    if decision.action != "start":
        raise RuntimeError(f"the simulated rollout did not start: {decision.reason}")
    return state


def _batch(
    rng: np.random.Generator,
    settings: RolloutSettings,
    fleet: FleetModel,
    percent: float,
    harm_ratio: float,
    batch_id: str,
) -> pd.DataFrame:
    """One publish: a record per car, the cohort by the stage's percent of the fleet."""
    candidates = max(1, round(fleet.vehicles * percent / 100.0))
    cars = np.arange(fleet.vehicles)
    on_candidate = cars < candidates
    frames = np.full(fleet.vehicles, fleet.frames_per_batch)
    columns: dict[str, Any] = {
        "engine_sha256": np.where(on_candidate, CANDIDATE_SHA, PRODUCTION_SHA),
        "vehicle_pseudonym": [f"car-{i}" for i in cars],
        "frames": frames,
        "batch_id": batch_id,
    }
    for name, event in settings.events.items():
        rate = event.control_rate_per_1k_frames / 1000.0
        factor = np.where(on_candidate & (name == "at_fault_collisions"), harm_ratio, 1.0)
        columns[event.column] = rng.poisson(rate * factor * frames)
    if "collisions" not in columns:  # every simulated collision is at fault
        columns["collisions"] = columns.get("at_fault_collisions", np.zeros(len(cars), int))
    share = np.clip(rng.normal(0.05, 0.02, fleet.vehicles), 0.0, 1.0)
    columns["fallback_frames"] = np.round(share * frames).astype(int)
    columns["latency_ms_p95"] = rng.normal(20.0, 2.0, fleet.vehicles)
    means = np.clip(rng.normal(0.8, 0.03, fleet.vehicles), 0.0, 0.99)
    bins = np.minimum((means * CONFIDENCE_BINS).astype(int), CONFIDENCE_BINS - 1)
    columns["confidence_histogram"] = [
        [int(frames[i]) if b == bin_ else 0 for b in range(CONFIDENCE_BINS)]
        for i, bin_ in enumerate(bins)
    ]
    return pd.DataFrame(columns)


@dataclass(frozen=True)
class TrialOutcome:
    ending: str  # rolled_back | approval | stalled
    stage: str
    candidate_frames: int  # over all stages, up to the ending


def run_trial(
    rng: np.random.Generator, settings: RolloutSettings, fleet: FleetModel, harm_ratio: float
) -> TrialOutcome:
    """One simulated rollout from canary to its ending."""
    state = _started(settings)
    stage_records: list[pd.DataFrame] = []
    total_frames = 0
    for index in range(fleet.max_batches * len(settings.stages)):
        stage = settings.stages[state.stage_index]
        batch = _batch(rng, settings, fleet, stage.percent, harm_ratio, f"b{index}")
        stage_records.append(batch)
        total_frames += int(batch.loc[batch["engine_sha256"] == CANDIDATE_SHA, "frames"].sum())
        records = pd.concat(stage_records, ignore_index=True)
        state, decision = evaluate_stage(
            state, settings, telemetry_commit=f"T{index + 1}", records=records, at=f"t{index}"
        )
        if state.status == ROLLED_BACK:
            return TrialOutcome("rolled_back", stage.name, total_frames)
        if state.status == AWAITING_APPROVAL:
            return TrialOutcome("approval", stage.name, total_frames)
        if decision.action == "advance":
            stage_records = []
            continue
        frames = int(decision.candidate.frames) if decision.candidate else 0
        if stage.exposure_cap_frames and frames >= stage.exposure_cap_frames:
            return TrialOutcome("stalled", stage.name, total_frames)
        if len(stage_records) >= fleet.max_batches:
            return TrialOutcome("stalled", stage.name, total_frames)
    return TrialOutcome("stalled", settings.stages[state.stage_index].name, total_frames)


def calibrate_rollout(
    trials: int, config: Mapping[str, Any] | None = None, seed: int = 0
) -> dict[str, Any]:
    """The figures of ``benchmarks/canary_calibration.py`` over ``trials`` per candidate kind."""
    settings = RolloutSettings.load(config)
    fleet = FleetModel.load(config)
    rng = np.random.default_rng(seed)
    equal = [run_trial(rng, settings, fleet, 1.0) for _ in range(trials)]
    harmful = [run_trial(rng, settings, fleet, 2.0) for _ in range(trials)]

    def share(outcomes: list[TrialOutcome], ending: str) -> float:
        return sum(o.ending == ending for o in outcomes) / len(outcomes)

    def median_frames(outcomes: list[TrialOutcome], ending: str) -> float | None:
        frames = [o.candidate_frames for o in outcomes if o.ending == ending]
        return float(np.median(frames)) if frames else None

    return {
        "trials": trials,
        "equal_rolled_back": share(equal, "rolled_back"),
        "harm_2x_rolled_back": share(harmful, "rolled_back"),
        "equal_advanced": share(equal, "approval"),
        "equal_stalled": share(equal, "stalled"),
        "harm_2x_reached_approval": share(harmful, "approval"),
        "median_frames_to_rollback_2x": median_frames(harmful, "rolled_back"),
        "median_frames_to_advance_equal": median_frames(equal, "approval"),
        "harm_2x_rolled_back_by_stage": {
            stage.name: sum(o.ending == "rolled_back" and o.stage == stage.name for o in harmful)
            / trials
            for stage in settings.stages
        },
        "stage_exposure_cap_frames": {s.name: s.exposure_cap_frames for s in settings.stages},
        "fleet": {
            "vehicles": fleet.vehicles,
            "frames_per_batch": fleet.frames_per_batch,
            "max_batches": fleet.max_batches,
        },
    }
