"""Size the car's network to the target's budget: the most accurate width that fits it.

For each ``--width``: the car's architecture (``training.yaml`` ``model`` with that width) is
trained per seed with the project's recipe on a simulated fleet and scored per slice on a
frozen benchmark (the distillation benchmark's split and scoring); then the seed-0 network is
exported, quantized as the loop quantizes for the target (deployment.yaml, camera input
included) and its INT8 engine measured on the target's backend as ``engine_benchmark``
measures it. Each width is held to the target's budget in gates.yaml
``deployment.latency.<target>`` — multiply-accumulates per frame, p99 latency at batch 1,
throughput at the serving batch, peak memory — with ``engine_benchmark``'s own gate
(``reports.latency_failures``). The choice is the width with the best mean worst-slice
accuracy among those that fit, not the one that trains fastest.

    .venv/bin/python benchmarks/student_sizing.py [--widths 8 16 32] [--seeds 2] [--epochs 6]
        [--target cpu-ci] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from distillation import split_benchmark, train  # same folder, run as a script
from engines import shipped_int8
from selection import fleet_frames, worst_and_overall

from aiinfra_pipelines.deployment.export import export_checked_onnx
from aiinfra_pipelines.deployment.frames import labelled_frames
from aiinfra_pipelines.deployment.model_cost import count_macs, count_parameters
from aiinfra_pipelines.deployment.reports import (
    check_target_hardware,
    latency_failures,
    measure_on_target,
)
from aiinfra_pipelines.deployment.settings import (
    DeploymentSettings,
    LatencyBudget,
    deployment_gates,
)
from aiinfra_pipelines.evaluation.predict import slice_metrics
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.training.settings import load_training_config


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def engine_cost(network: Any, frames: Any, target_name: str) -> dict[str, Any]:
    """The INT8 engine of ``network`` as the loop builds it for the target, measured there."""
    settings, spec = DeploymentSettings.load(), perception_spec()
    target = settings.targets[target_name]
    quantization = settings.quantization.for_target(target)
    calibration = labelled_frames(frames.sample(n=min(256, len(frames)), random_state=0), spec)
    exported = export_checked_onnx(
        network, calibration.head(32).inputs(), tolerance=1e-4, opset=settings.opset
    )
    int8, info = shipped_int8(
        exported.onnx_bytes, calibration, quantization, deployment_gates(), spec, settings
    )
    # A width whose PTQ INT8 breaches the budget is timed from the last plan and counted as
    # not fitting the INT8 budget (the loop would try QAT, then ship FP16 or FP32).
    error = info["int8_quantization_error"]
    quantization_failure = f"PTQ INT8 breaches the quantization budget: {error}" if error else ""
    images = calibration.spread(settings.benchmark.frames).images
    platform = check_target_hardware(target)
    stats = measure_on_target(int8, "int8", images, platform, target, settings, spec)
    return {
        "int8_p99_ms": round(stats.p99_ms, 4),
        "int8_fps": round(stats.throughput_fps, 1),
        "int8_peak_mb": round(stats.peak_memory_mb, 1),
        "int8_bytes": len(int8),
        "quantization_failure": quantization_failure,
        "stats": stats,
    }


def one_width(width: int, seeds: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Accuracy over seeds and the INT8 engine's cost on the target, for one width."""
    config = load_training_config({"max_epochs": args.epochs, "model": {"width": width}})
    result: dict[str, Any] = {"width": width, "seeds": []}
    network = None
    for seed in seeds:
        started = time.monotonic()
        training, benchmark = split_benchmark(
            fleet_frames(args.vehicles, args.episodes, seed, args.cache), seed
        )
        trained = train(training, config, seed)
        scores = worst_and_overall(slice_metrics(trained, benchmark), args.min_slice_frames)
        result["seeds"].append(
            {
                "seed": seed,
                "worst_slice": scores["worst_slice"],
                "worst_slice_accuracy": round(scores["worst_slice_accuracy"], 4),
                "overall_accuracy": round(scores["overall_accuracy"], 4),
                "train_seconds": round(time.monotonic() - started, 1),
            }
        )
        _say(
            f"width {width} seed {seed}: worst {scores['worst_slice']} "
            f"{scores['worst_slice_accuracy']:.4f}, overall {scores['overall_accuracy']:.4f} "
            f"({time.monotonic() - started:.0f} s)"
        )
        if network is None:
            network, network_frames = trained, training
    assert network is not None
    result["worst_slice_accuracy"] = round(
        statistics.fmean(s["worst_slice_accuracy"] for s in result["seeds"]), 4
    )
    result["overall_accuracy"] = round(
        statistics.fmean(s["overall_accuracy"] for s in result["seeds"]), 4
    )
    result["train_seconds"] = round(statistics.fmean(s["train_seconds"] for s in result["seeds"]))
    result["macs_per_frame"] = count_macs(network)
    result["parameters"] = count_parameters(network)
    cost = engine_cost(network, network_frames, args.target)
    stats = cost.pop("stats")
    result.update(cost)
    budget = LatencyBudget.load(args.target)
    result["budget_failures"] = latency_failures(stats, budget, result["macs_per_frame"]) + (
        [result["quantization_failure"][:300]] if result["quantization_failure"] else []
    )
    result["fits"] = not result["budget_failures"]
    _say(
        f"width {width}: {result['macs_per_frame'] / 1e6:.1f} M MACs/frame, INT8 "
        f"{result['int8_fps']:.0f} frames/s, p99 {result['int8_p99_ms']:.2f} ms, "
        f"{result['int8_peak_mb']:.0f} MiB: {'fits' if result['fits'] else 'over budget'}"
    )
    return result


def choose(widths: list[dict[str, Any]]) -> int | None:
    """The most accurate width (mean worst slice, then overall) among those that fit."""
    fitting = [w for w in widths if w["fits"]]
    if not fitting:
        return None
    best = max(fitting, key=lambda w: (w["worst_slice_accuracy"], w["overall_accuracy"]))
    return int(best["width"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--vehicles", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--min-slice-frames", type=int, default=10)
    parser.add_argument("--target", default="cpu-ci", help="deployment.yaml target")
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "aiinfra-selection-bench"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    budget = LatencyBudget.load(args.target)
    started = time.monotonic()
    widths = [one_width(width, list(range(args.seeds)), args) for width in args.widths]
    report = {
        "target": args.target,
        "budget": {
            "max_macs_per_frame": budget.max_macs_per_frame,
            "p99_ms_batch1": budget.p99_ms_batch1,
            "min_throughput_fps": budget.min_throughput_fps,
            "max_peak_memory_mb": budget.max_peak_memory_mb,
        },
        "epochs": args.epochs,
        "widths": widths,
        "choice": choose(widths),
        "training_yaml_width": int(load_training_config()["model"]["width"]),
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for width in widths:
        print(
            f"width {width['width']:3d}: worst slice {width['worst_slice_accuracy']:.4f} "
            f"overall {width['overall_accuracy']:.4f}  {width['macs_per_frame'] / 1e6:7.1f} M "
            f"MACs  INT8 {width['int8_fps']:7.0f} fps p99 {width['int8_p99_ms']:.2f} ms "
            f"{width['int8_peak_mb']:.0f} MiB  {'fits' if width['fits'] else 'over budget'}"
        )
    print(f"choice: width {report['choice']} (training.yaml: {report['training_yaml_width']})")


if __name__ == "__main__":
    main()
