"""Cloud teacher vs car student vs the student distilled from the teacher, per slice.

Per seed: a simulated fleet (highway-env, cached like ``benchmarks/selection.py``'s) is split
by log into a frozen benchmark (``datasets.benchmark.freeze_benchmark``: held-out logs per
slice) and a training set. Three networks train on the training set with the project's
Lightning recipe (``training.yaml``), the same seed and epochs:

* ``teacher``: ``training.yaml`` ``teacher``'s architecture (``teacher.max_epochs`` unless
  ``--teacher-epochs``);
* ``student``: the car's architecture, on the labels alone;
* ``distilled``: the car's architecture with ``training.yaml`` ``distillation``'s loss
  against the teacher (``PerceptionModule.attach_teacher``, what ``trained_model`` does).

Each is scored per slice on the benchmark (``evaluation.predict.slice_metrics``). Worst slice
= the lowest occupancy accuracy among slices with at least ``--min-slice-frames`` frames.

``--labelled-share S`` < 1 is the label budget: only a share S of the training logs (drawn per
seed) keeps its labels. Teacher and student train on those; the distilled student also reads
the other logs' frames without labels, learning them from the teacher's readings alone (a
transfer set, ``train_perception_model(transfer_frames=...)``).

    .venv/bin/python benchmarks/distillation.py [--json] [--seeds 3] [--epochs 10]
        [--param weight=0.7] [--teacher-param width=48] [--student-param width=32]
        [--labelled-share 0.33]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch

# The fleet cache, the split and the per-slice scoring are the selection benchmark's (same
# directory: run as a script, this one's folder is on sys.path).
from selection import fleet_frames, worst_and_overall

from aiinfra_pipelines.datasets.benchmark import benchmark_log_ids, freeze_benchmark
from aiinfra_pipelines.evaluation.predict import slice_metrics
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.training.datamodule import PerceptionDataModule
from aiinfra_pipelines.training.module import PerceptionModule
from aiinfra_pipelines.training.settings import load_training_config
from aiinfra_pipelines.training.teacher import teacher_overrides
from aiinfra_pipelines.training.trainer import scratch_trainer

ARMS = ("teacher", "student", "distilled")


def split_benchmark(frames: pd.DataFrame, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(training frames, benchmark frames), split by log as the dataset layer freezes it."""
    manifest = freeze_benchmark(None, frames, fraction=0.25, seed=seed, min_logs_per_slice=1)
    held = frames["log_id"].isin(set(benchmark_log_ids(manifest)))
    return frames[~held].reset_index(drop=True), frames[held].reset_index(drop=True)


def split_labelled(frames: pd.DataFrame, share: float, seed: int) -> tuple[pd.DataFrame, ...]:
    """(labelled frames, frames whose labels the budget leaves out), split by log."""
    if not 0.0 < share <= 1.0:
        raise SystemExit(f"--labelled-share must be within (0, 1], got {share}")
    logs = np.array(sorted(frames["log_id"].unique()))
    np.random.default_rng(seed).shuffle(logs)
    kept = frames["log_id"].isin(set(logs[: max(1, round(len(logs) * share))]))
    return frames[kept].reset_index(drop=True), frames[~kept].reset_index(drop=True)


def train(
    frames: pd.DataFrame,
    config: dict[str, Any],
    seed: int,
    teacher: torch.nn.Module | None = None,
    transfer: pd.DataFrame | None = None,
) -> torch.nn.Module:
    """``config``'s network trained with the project's recipe (distilled when ``teacher``,
    also on ``transfer``'s frames without labels)."""
    L.seed_everything(seed, workers=True, verbose=False)
    spec = perception_spec()
    datamodule = PerceptionDataModule.from_config(
        frames, frames, config, seed=seed, spec=spec, transfer_frames=transfer
    )
    module = PerceptionModule.from_config(spec, config, seed)
    if teacher is not None:
        section = config["distillation"]
        module.attach_teacher(teacher, float(section["weight"]), float(section["temperature"]))
    trainer = scratch_trainer(config, max_epochs=int(config["max_epochs"]))
    trainer.fit(module, datamodule=datamodule)
    return module.net.eval()


def configs(
    epochs: int,
    teacher_epochs: int | None,
    distillation: dict[str, Any],
    teacher_model: dict[str, Any],
    student_model: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """The recipe of each arm: ``training.yaml`` with the benchmark's overrides."""
    student = load_training_config(
        {"max_epochs": epochs, "distillation": distillation}
        | ({"model": student_model} if student_model else {})
    )
    teacher_extra: dict[str, Any] = {"model": teacher_model} if teacher_model else {}
    teacher = load_training_config(
        {
            **teacher_overrides(teacher_extra and {"teacher": teacher_extra}),
            **({"max_epochs": teacher_epochs} if teacher_epochs else {}),
        }
    )
    return {"teacher": teacher, "student": student, "distilled": student}


def one_seed(
    frames: pd.DataFrame,
    seed: int,
    recipes: dict[str, dict[str, Any]],
    min_slice_frames: int,
    labelled_share: float = 1.0,
) -> dict[str, Any]:
    """Every arm's benchmark figures for one seed's fleet."""
    started = time.monotonic()
    training, benchmark = split_benchmark(frames, seed)
    training, unlabelled = split_labelled(training, labelled_share, seed)
    result: dict[str, Any] = {
        "seed": seed,
        "train_frames": len(training),
        "transfer_frames": len(unlabelled),
        "benchmark_frames": len(benchmark),
    }
    networks: dict[str, torch.nn.Module] = {}
    for arm in ARMS:
        arm_started = time.monotonic()
        teacher = networks["teacher"] if arm == "distilled" else None
        transfer = unlabelled if arm == "distilled" else None
        networks[arm] = train(training, recipes[arm], seed, teacher, transfer)
        metrics = slice_metrics(networks[arm], benchmark)
        overall = metrics[metrics["kind"] == "overall"].iloc[0]
        result[arm] = {
            **worst_and_overall(metrics, min_slice_frames),
            "overall_f1": round(float(overall["occupancy_f1"]), 4),
            "overall_lead_gap_mae_m": round(float(overall["lead_gap_mae_m"]), 3),
            "train_seconds": round(time.monotonic() - arm_started, 1),
        }
        print(  # progress: a seed takes minutes on a laptop CPU
            f"seed {seed} {arm}: worst {result[arm]['worst_slice']} "
            f"{result[arm]['worst_slice_accuracy']:.4f} overall "
            f"{result[arm]['overall_accuracy']:.4f} ({result[arm]['train_seconds']} s)",
            file=sys.stderr,
            flush=True,
        )
    # The distilled student judged on the undistilled student's worst slice too: distillation
    # must lift the slice the car's network is weakest on, not just move the minimum.
    weakest = result["student"]["worst_slice"]
    result["distilled_on_student_worst_slice"] = result["distilled"]["per_slice"][weakest]
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def summarize(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds per arm, and how often the distilled student beats the plain one."""

    def mean(values: list[float]) -> float:
        return round(statistics.fmean(values), 4)

    summary: dict[str, Any] = {"seeds": [result["seed"] for result in per_seed]}
    for arm in ARMS:
        summary[arm] = {
            "worst_slice_accuracy": mean([r[arm]["worst_slice_accuracy"] for r in per_seed]),
            "overall_accuracy": mean([r[arm]["overall_accuracy"] for r in per_seed]),
            "overall_f1": mean([r[arm]["overall_f1"] for r in per_seed]),
            "overall_lead_gap_mae_m": mean([r[arm]["overall_lead_gap_mae_m"] for r in per_seed]),
            "train_seconds": mean([r[arm]["train_seconds"] for r in per_seed]),
        }
    gains = [
        r["distilled"]["worst_slice_accuracy"] - r["student"]["worst_slice_accuracy"]
        for r in per_seed
    ]
    summary["distilled_minus_student_worst_slice"] = {
        "mean": round(statistics.fmean(gains), 4),
        "per_seed": [round(gain, 4) for gain in gains],
        "seeds_ahead": sum(gain > 0 for gain in gains),
    }
    summary["distilled_worst_slice_accuracy"] = summary["distilled"]["worst_slice_accuracy"]
    summary["student_worst_slice_accuracy"] = summary["student"]["worst_slice_accuracy"]
    summary["teacher_worst_slice_accuracy"] = summary["teacher"]["worst_slice_accuracy"]
    return summary


def _pairs(pairs: list[str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if not value:
            raise SystemExit(f"expected NAME=VALUE, got {pair!r}")
        parsed[name] = json.loads(value)
    return parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds first..first+N-1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--vehicles", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=10, help="student epochs (both arms)")
    parser.add_argument("--teacher-epochs", type=int, help="default: training.yaml teacher")
    parser.add_argument("--min-slice-frames", type=int, default=10)
    parser.add_argument(
        "--labelled-share",
        type=float,
        default=1.0,
        help="share of training logs that keep labels; the distilled student reads the rest "
        "without labels (a transfer set)",
    )
    parser.add_argument(
        "--param", action="append", default=[], metavar="NAME=VALUE", help="distillation key"
    )
    parser.add_argument(
        "--teacher-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="teacher model key (training.yaml teacher.model)",
    )
    parser.add_argument(
        "--student-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="student model key (training.yaml model), e.g. width=32: a student sized to the car",
    )
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "aiinfra-selection-bench"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--details", type=Path, help="also write per-seed details (JSON) here")
    args = parser.parse_args()
    recipes = configs(
        args.epochs,
        args.teacher_epochs,
        _pairs(args.param),
        _pairs(args.teacher_param),
        _pairs(args.student_param),
    )
    started = time.monotonic()
    per_seed = [
        one_seed(
            fleet_frames(args.vehicles, args.episodes, seed, args.cache),
            seed,
            recipes,
            args.min_slice_frames,
            args.labelled_share,
        )
        for seed in range(args.first_seed, args.first_seed + args.seeds)
    ]
    summary = summarize(per_seed)
    summary["labelled_share"] = args.labelled_share
    summary["seconds"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for arm in ARMS:
            figures = summary[arm]
            print(
                f"{arm:10s} worst slice {figures['worst_slice_accuracy']:.4f}  overall "
                f"{figures['overall_accuracy']:.4f}  f1 {figures['overall_f1']:.4f}  "
                f"gap MAE {figures['overall_lead_gap_mae_m']:.2f} m  "
                f"train {figures['train_seconds']:.0f} s"
            )
        gain = summary["distilled_minus_student_worst_slice"]
        print(
            f"distilled - student, worst slice: {gain['mean']:+.4f} "
            f"(ahead on {gain['seeds_ahead']}/{len(per_seed)} seeds: {gain['per_seed']})"
        )
    if args.details:
        args.details.write_text(json.dumps(per_seed, indent=2))


if __name__ == "__main__":
    main()
