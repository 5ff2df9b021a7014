"""The gates-2 rollout's error rates (point estimates against budgets), for the before/after
of gates-3: the same simulated streams as ``release/rollout_calibration.py`` (200 cars, 500
frames per car per publish, 1.2 at-fault collisions and 3.85 near misses per 1,000 frames),
pushed through gates-2's real ``evaluate_stage``. It imports gates-2's code, so it runs only
against commit b21e4cd (the last one before gates-3):

    git worktree add /tmp/gates-2 b21e4cd
    PYTHONPATH=/tmp/gates-2 AIINFRA_RESOURCES=/tmp/gates-2/resources \\
        .venv/bin/python benchmarks/canary_gates2_replay.py --trials 300

Prints one JSON object; asserts nothing.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.release.rollout import new_rollout_state, start_rollout
from aiinfra_pipelines.release.rollout_evaluation import evaluate_stage
from aiinfra_pipelines.release.rollout_settings import RolloutSettings
from aiinfra_pipelines.release.rollout_state import AWAITING_APPROVAL, ROLLED_BACK

CANDIDATE, PRODUCTION = "c" * 64, "b" * 64
POINTER = {"version": "1", "onnx_key": "x", "engine_sha256": PRODUCTION, "commit": "m0"}
VEHICLES, FRAMES_PER_BATCH, BINS = 200, 500, 10
AT_FAULT_RATE, NEAR_MISS_RATE = 1.2e-3, 3.85e-3


def publish(rng: np.random.Generator, percent: float, ratio: float, batch: str) -> pd.DataFrame:
    cars = np.arange(VEHICLES)
    candidate = cars < max(1, round(VEHICLES * percent / 100))
    frames = np.full(VEHICLES, FRAMES_PER_BATCH)
    means = np.clip(rng.normal(0.8, 0.03, VEHICLES), 0, 0.99)
    bins = np.minimum((means * BINS).astype(int), BINS - 1)
    share = np.clip(rng.normal(0.05, 0.02, VEHICLES), 0, 1)
    return pd.DataFrame(
        {
            "engine_sha256": np.where(candidate, CANDIDATE, PRODUCTION),
            "vehicle_pseudonym": [f"car-{i}" for i in cars],
            "frames": frames,
            "batch_id": batch,
            "collisions": rng.poisson(AT_FAULT_RATE * np.where(candidate, ratio, 1.0) * frames),
            "near_misses": rng.poisson(NEAR_MISS_RATE * frames),
            "fallback_frames": np.round(share * frames).astype(int),
            "latency_ms_p95": rng.normal(20.0, 2.0, VEHICLES),
            "confidence_histogram": [
                [int(frames[i]) if b == k else 0 for b in range(BINS)] for i, k in enumerate(bins)
            ],
        }
    )


def trial(rng: np.random.Generator, settings: RolloutSettings, ratio: float) -> tuple[str, int]:
    state = new_rollout_state(
        "2",
        CANDIDATE,
        engine_key="k",
        model_uri="r",
        production=POINTER,
        production_engine_sha256=PRODUCTION,
        shadow={"passed": True, "frames": 1000, "decision_agreement": 0.9, "reasons": []},
        at="t0",
    )
    state, _ = start_rollout(
        state,
        settings,
        telemetry_commit="T0",
        production=POINTER,
        production_engine_sha256=PRODUCTION,
        active_rollout=None,
        at="t0",
    )
    records: list[pd.DataFrame] = []
    total = 0
    for index in range(400):
        batch = publish(rng, settings.stages[state.stage_index].percent, ratio, f"b{index}")
        records.append(batch)
        total += int(batch.loc[batch["engine_sha256"] == CANDIDATE, "frames"].sum())
        state, decision = evaluate_stage(
            state,
            settings,
            telemetry_commit=f"T{index + 1}",
            records=pd.concat(records, ignore_index=True),
            at=f"t{index}",
        )
        if state.status == ROLLED_BACK:
            return "rolled_back", total
        if state.status == AWAITING_APPROVAL:
            return "approval", total
        if decision.action == "advance":
            records = []
    return "stalled", total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    settings = RolloutSettings.load(load_resource_yaml("gates.yaml"))
    rng = np.random.default_rng(args.seed)
    equal = [trial(rng, settings, 1.0) for _ in range(args.trials)]
    harmful = [trial(rng, settings, 2.0) for _ in range(args.trials)]

    def share(outcomes: list[tuple[str, int]], ending: str) -> float:
        return sum(o[0] == ending for o in outcomes) / len(outcomes)

    def median(outcomes: list[tuple[str, int]], ending: str) -> float | None:
        frames = [o[1] for o in outcomes if o[0] == ending]
        return float(np.median(frames)) if frames else None

    print(
        json.dumps(
            {
                "gates": "gates-2 (point estimates against budgets)",
                "trials": args.trials,
                "equal_rolled_back": share(equal, "rolled_back"),
                "harm_2x_rolled_back": share(harmful, "rolled_back"),
                "equal_advanced": share(equal, "approval"),
                "median_frames_to_rollback_2x": median(harmful, "rolled_back"),
                "median_frames_to_advance_equal": median(equal, "approval"),
            }
        )
    )


if __name__ == "__main__":
    main()
