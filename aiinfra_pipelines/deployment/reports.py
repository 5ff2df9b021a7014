"""The engine_parity and engine_benchmark gate reports, as plain functions of engines and frames.

Each report is a JSON document with a top-level ``passed`` and ``model_version`` (docs/loop.md):
it is what the blocking checks read, what ``published_engine`` puts on ``main`` and what
certification later re-verifies, so it carries the numbers behind the verdict, not only the
verdict.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from aiinfra_pipelines.perception.contract import PerceptionSpec

from .backends import create_engine, resolve_backend
from .benchmark import LatencyStats, measure_engine
from .frames import LabelledFrames
from .layerwise import first_divergence, layerwise_comparison
from .memory_probe import probe_peak_memory_mb
from .parity import EngineComparison, compare_with_fp32, slice_metrics
from .selection import EngineOption, select_engine
from .settings import DeploymentSettings, DeploymentTarget, LatencyBudget

PARITY_GATE = "engine_parity"
BENCHMARK_GATE = "engine_benchmark"


class TargetMismatchError(RuntimeError):
    """This machine is not the hardware the target's latency budget is defined for."""


def _records(frame) -> list[dict[str, Any]]:
    return [
        {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
        for row in frame.to_dict(orient="records")
    ]


def engine_parity_report(
    lineage: Mapping[str, Any],
    fp32_onnx: bytes,
    engines: Mapping[str, bytes],
    frames: LabelledFrames,
    section: Mapping[str, Any],
    spec: PerceptionSpec,
    *,
    layerwise_frames: int,
    flag_sqnr_db: float,
    benchmark_version: str = "",
    ship_precisions: Sequence[str] = ("int8",),
) -> tuple[dict[str, Any], list[EngineComparison]]:
    """Every engine vs the FP32 engine on ``frames``, per slice, plus the layer-wise view.

    The gate passes when one of ``ship_precisions`` (the target's list) holds every slice: the
    smallest such engine is ``ship_precision``, the one the candidate ships (deployment.selection).
    An engine that breaks a budget is reported, with its failures, and not chosen.
    """
    reference = create_engine(fp32_onnx, spec, precision="fp32").infer(frames.images)
    fp32_table = slice_metrics(frames, reference, reference, spec)
    sample = frames.spread(layerwise_frames).inputs()
    comparisons, per_engine, layerwise = [], {}, {}
    for precision, onnx_bytes in engines.items():
        predictions = create_engine(onnx_bytes, spec, precision=precision).infer(frames.images)
        table = slice_metrics(frames, predictions, reference, spec)
        comparison = compare_with_fp32(precision, table, fp32_table, section)
        comparisons.append(comparison)
        per_engine[precision] = {
            "sha256": hashlib.sha256(onnx_bytes).hexdigest(),
            "passed": comparison.passed,
            "failures": comparison.failures,
            "worst": comparison.worst(),
            "comparison": comparison.to_records(),
            "metrics": _records(table),
        }
        tensors = layerwise_comparison(fp32_onnx, onnx_bytes, sample)
        layerwise[precision] = {
            "frames": len(sample),
            "first_divergence": first_divergence(tensors, flag_sqnr_db),
            "flag_sqnr_db": flag_sqnr_db,
            "tensors": _records(tensors),
        }
    options = {
        "fp32": EngineOption("fp32", len(fp32_onnx), holds=True),  # the reference itself
        **{
            comparison.engine: EngineOption(
                comparison.engine,
                len(engines[comparison.engine]),
                holds=comparison.passed,
                failures=comparison.failures,
            )
            for comparison in comparisons
        },
    }
    choice, selection = select_engine(options, ship_precisions)
    failures = [] if choice is not None else _refusals(options, ship_precisions)
    report = {
        "gate": PARITY_GATE,
        "model_version": str(lineage["model_version"]),
        "passed": choice is not None,
        "failures": failures,
        "ship_precision": choice,
        "selection": selection,
        "benchmark_version": benchmark_version,
        "frames": len(frames),
        "reference": {"precision": "fp32", "sha256": hashlib.sha256(fp32_onnx).hexdigest()},
        "budgets": dict(section),
        "fp32_metrics": _records(fp32_table),
        "engines": per_engine,
        "layerwise": layerwise,
        "layerwise_note": (
            "inner tensors are read from graphs with those tensors exposed as outputs, which can "
            "keep onnxruntime from fusing Q/DQ into integer kernels; the per-slice verdict above "
            "is always from the unmodified engines"
        ),
    }
    return report, comparisons


def _refusals(options: Mapping[str, EngineOption], allowed: Sequence[str]) -> list[str]:
    """Why no engine the target may run can ship: each allowed engine's breaches, or absence."""
    failures = []
    for name in allowed:
        if name not in options:
            failures.append(f"{name}: no engine was built (quantized_engine could not make one)")
        else:
            failures.extend(options[name].failures)
    return failures


def latency_failures(
    stats: LatencyStats, budget: LatencyBudget, macs_per_frame: int | None = None
) -> list[str]:
    """Why ``stats`` (and the network's ``macs_per_frame``) break ``budget`` (empty: holds)."""
    failures = []
    if budget.max_macs_per_frame is not None:
        if macs_per_frame is None:
            failures.append(
                f"the network's multiply-accumulates per frame are unknown; {budget.target} "
                f"allows {budget.max_macs_per_frame:.3g}"
            )
        elif macs_per_frame > budget.max_macs_per_frame:
            failures.append(
                f"network {macs_per_frame / 1e6:.1f} M multiply-accumulates per frame > budget "
                f"{budget.max_macs_per_frame / 1e6:.1f} M ({budget.target})"
            )
    if stats.p99_ms > budget.p99_ms_batch1:
        failures.append(
            f"{stats.precision} p99 latency {stats.p99_ms:.2f} ms at batch 1 > budget "
            f"{budget.p99_ms_batch1:.2f} ms ({budget.target})"
        )
    if stats.throughput_fps < budget.min_throughput_fps:
        failures.append(
            f"{stats.precision} throughput {stats.throughput_fps:.0f} frames/s at batch "
            f"{stats.serving_batch} < budget {budget.min_throughput_fps:.0f} ({budget.target})"
        )
    if stats.peak_memory_mb > budget.max_peak_memory_mb:
        failures.append(
            f"{stats.precision} peak memory {stats.peak_memory_mb:.0f} MiB > budget "
            f"{budget.max_peak_memory_mb:.0f} MiB ({budget.target})"
        )
    return failures


def check_target_hardware(target: DeploymentTarget) -> dict[str, str]:
    """The platform the target's engines will be measured on; refuse the wrong hardware."""
    backend = resolve_backend(target.backend)  # BackendUnavailableError names what is missing
    platform = {"backend": backend}
    if backend == "tensorrt":
        from .backends.tensorrt import current_platform

        here = current_platform()
        platform.update(
            tensorrt_version=here.tensorrt_version,
            compute_capability=here.compute_capability,
            device_name=here.device_name,
        )
        if target.compute_capability and here.compute_capability != target.compute_capability:
            raise TargetMismatchError(
                f"target {target.name} runs on compute capability {target.compute_capability}; "
                f"this machine's GPU ({here.device_name}) is {here.compute_capability}, so its "
                "latency says nothing about the target: run engine_benchmark on target hardware"
            )
    else:
        import platform as host

        platform.update(machine=host.machine(), processor=host.processor() or host.machine())
    return platform


def engine_benchmark_report(
    lineage: Mapping[str, Any],
    engines: Mapping[str, bytes],
    images,
    target: DeploymentTarget,
    budget: LatencyBudget,
    settings: DeploymentSettings,
    spec: PerceptionSpec,
    ship_precision: str,
    macs_per_frame: int | None = None,
) -> dict[str, Any]:
    """Latency/throughput/memory of every engine on the target's backend; ``ship_precision``
    (the engine engine_parity chose) is the one gated."""
    platform = check_target_hardware(target)
    bench = settings.benchmark
    stats = {
        precision: measure_on_target(
            onnx_bytes, precision, images, platform, target, settings, spec
        )
        for precision, onnx_bytes in engines.items()
    }
    if ship_precision not in target.ship_precisions:
        raise ValueError(
            f"target {target.name} does not run {ship_precision} engines "
            f"(ship_precisions {list(target.ship_precisions)})"
        )
    if ship_precision not in stats:
        raise ValueError(f"no {ship_precision} engine to gate for target {target.name}")
    shipped = stats[ship_precision]
    failures = latency_failures(shipped, budget, macs_per_frame)
    return {
        "gate": BENCHMARK_GATE,
        "model_version": str(lineage["model_version"]),
        "passed": not failures,
        "failures": failures,
        "target": target.name,
        "runtime_target": target.runtime_target,
        "ship_precision": ship_precision,
        "platform": platform,
        "budget": {
            "p99_ms_batch1": budget.p99_ms_batch1,
            "min_throughput_fps": budget.min_throughput_fps,
            "max_peak_memory_mb": budget.max_peak_memory_mb,
            "max_macs_per_frame": budget.max_macs_per_frame,
        },
        "model": {"macs_per_frame": macs_per_frame},
        "settings": {
            "iterations": bench.iterations,
            "warmup": bench.warmup,
            "serving_batch": bench.serving_batch,
            "throughput_iterations": bench.throughput_iterations,
            "frames": len(images),
            "intra_op_threads": target.intra_op_threads,
        },
        "engines": {precision: entry.to_dict() for precision, entry in stats.items()},
        "ratios": ratios_to_fp32(stats),
    }


def measure_on_target(
    onnx_bytes: bytes,
    precision: str,
    images,
    platform: Mapping[str, Any],
    target: DeploymentTarget,
    settings: DeploymentSettings,
    spec: PerceptionSpec,
) -> LatencyStats:
    """One engine's latency, throughput and (on onnxruntime, in a child process) peak memory."""
    bench, trt = settings.benchmark, settings.tensorrt
    options = {
        "batch_size": bench.serving_batch,
        "intra_op_threads": target.intra_op_threads,
        "cache_dir": trt.cache_dir,
        "opt_batch": bench.serving_batch,
        "max_batch": trt.max_batch,
        "workspace_mb": trt.workspace_mb,
    }
    probe = None
    if platform["backend"] == "onnxruntime":
        probe = partial(
            probe_peak_memory_mb,
            onnx_bytes,
            images,
            backend="onnxruntime",
            precision=precision,
            serving_batch=bench.serving_batch,
            intra_op_threads=target.intra_op_threads,
        )
    return measure_engine(
        lambda: create_engine(
            onnx_bytes, spec, backend=platform["backend"], precision=precision, **options
        ),
        images,
        precision=precision,
        iterations=bench.iterations,
        warmup=bench.warmup,
        serving_batch=bench.serving_batch,
        throughput_iterations=bench.throughput_iterations,
        memory_probe=probe,
    )


def ratios_to_fp32(stats: Mapping[str, LatencyStats]) -> dict[str, float]:
    """p50 latency and throughput of each engine relative to FP32 (latency < 1 = faster)."""
    fp32 = stats.get("fp32")
    ratios: dict[str, float] = {}
    if fp32 is None:
        return ratios
    for precision, entry in stats.items():
        if precision == "fp32":
            continue
        if fp32.p50_ms > 0:
            ratios[f"{precision}_vs_fp32_p50"] = round(entry.p50_ms / fp32.p50_ms, 3)
        if fp32.throughput_fps > 0:
            ratios[f"{precision}_vs_fp32_throughput"] = round(
                entry.throughput_fps / fp32.throughput_fps, 3
            )
    return ratios
