"""The compression report: every way to make the car's model smaller, measured side by side.

The cloud teacher, the car's network in FP32, its channel-pruned version, PTQ INT8 (the engine
``quantized_engine`` made), QAT INT8 and FP16 are each run on the frozen benchmark and on the
target's backend: per-slice accuracy, F1 and lead-gap error, latency p50/p99 at batch 1,
throughput at the serving batch, model size and peak memory. Each car-side variant is gated
against the car's FP32 network with the engines' parity budgets (gates.yaml
``deployment.parity``); the smallest one that holds every slice is the report's choice. The
teacher is measured for reference only: it is not a car model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from aiinfra_pipelines.perception.contract import PerceptionSpec

from .benchmark import LatencyStats
from .frames import LabelledFrames
from .parity import compare_with_fp32, slice_metrics
from .selection import EngineOption, smallest_holding
from .settings import DeploymentSettings, DeploymentTarget

# Variant names, in the report's order. The car's FP32 network is the reference of the gate.
TEACHER = "teacher_fp32"
STUDENT = "student_fp32"
PRUNED = "pruned_fp32"
PTQ = "ptq_int8"
QAT = "qat_int8"
FP16 = "fp16"
VARIANTS: tuple[str, ...] = (TEACHER, STUDENT, PRUNED, PTQ, QAT, FP16)
# What a variant's engine is built as on the target backend.
PRECISION = {
    TEACHER: "fp32",
    STUDENT: "fp32",
    PRUNED: "fp32",
    PTQ: "int8",
    QAT: "int8",
    FP16: "fp16",
}
# Per-slice label metrics the report tabulates (evaluate_by_slice's names).
SLICE_METRICS: tuple[str, ...] = ("occupancy_accuracy", "occupancy_f1", "lead_gap_mae_m")


@dataclass(frozen=True)
class CompressionVariant:
    """One compressed (or reference) model as an ONNX graph, or why there is none."""

    name: str
    onnx_bytes: bytes | None
    note: str = ""

    @property
    def precision(self) -> str:
        return PRECISION[self.name]


Measure = Callable[[bytes, str], LatencyStats]
Predict = Callable[[bytes, str], Any]


def compression_report(
    variants: list[CompressionVariant],
    benchmark: LabelledFrames,
    section: Mapping[str, Any],
    spec: PerceptionSpec,
    *,
    predict: Predict,
    measure: Measure,
) -> dict[str, Any]:
    """Every variant scored per slice on ``benchmark`` and timed with ``measure``.

    ``section`` is gates.yaml ``deployment.parity`` (per-slice drop budgets against the car's
    FP32 network); ``predict(onnx, precision)`` runs a graph over the benchmark frames and
    ``measure(onnx, precision)`` times it on the target. The choice is the smallest car-side
    variant (bytes of its graph) that holds every gated slice.
    """
    by_name = {variant.name: variant for variant in variants}
    student = by_name.get(STUDENT)
    if student is None or student.onnx_bytes is None:
        raise ValueError("the compression report needs the car's FP32 network (student_fp32)")
    reference = predict(student.onnx_bytes, "fp32")
    fp32_table = slice_metrics(benchmark, reference, reference, spec)
    rows: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    for name in VARIANTS:
        variant = by_name.get(name)
        if variant is None:
            continue
        if variant.onnx_bytes is None:
            rows.append({"variant": name, "available": False, "note": variant.note})
            continue
        table = slice_metrics(
            benchmark, predict(variant.onnx_bytes, variant.precision), reference, spec
        )
        comparison = compare_with_fp32(name, table, fp32_table, section)
        stats = measure(variant.onnx_bytes, variant.precision)
        overall = table[table["kind"] == "overall"].iloc[0]
        slice_rows = table[table["kind"] == "slice"]
        worst = slice_rows.loc[slice_rows["occupancy_accuracy"].idxmin()]
        rows.append(
            {
                "variant": name,
                "available": True,
                "precision": variant.precision,
                "note": variant.note,
                "bytes": len(variant.onnx_bytes),
                "occupancy_accuracy": round(float(overall["occupancy_accuracy"]), 4),
                "occupancy_f1": round(float(overall["occupancy_f1"]), 4),
                "lead_gap_mae_m": round(float(overall["lead_gap_mae_m"]), 3),
                "worst_slice": str(worst["slice"]),
                "worst_slice_accuracy": round(float(worst["occupancy_accuracy"]), 4),
                "p50_ms_batch1": round(stats.p50_ms, 4),
                "p99_ms_batch1": round(stats.p99_ms, 4),
                "throughput_fps": round(stats.throughput_fps, 1),
                "serving_batch": stats.serving_batch,
                "peak_memory_mb": round(stats.peak_memory_mb, 2),
                "within_budget": comparison.passed,
                "failures": comparison.failures[:5],
            }
        )
        for row in table.itertuples(index=False):
            slices.append(
                {
                    "variant": name,
                    "slice": str(row.slice),
                    "kind": str(row.kind),
                    "frames": int(row.frames),
                    **{metric: _rounded(getattr(row, metric)) for metric in SLICE_METRICS},
                }
            )
    return {
        "variants": rows,
        "per_slice": slices,
        "choice": smallest_within_budget(rows),
        "benchmark_frames": len(benchmark),
    }


def _rounded(value: Any) -> float | None:
    number = float(value)
    return None if number != number else round(number, 4)


def smallest_within_budget(rows: list[dict[str, Any]]) -> str | None:
    """The smallest car-side variant (graph bytes) that holds every gated slice, or None: the
    rule engine_parity ships by (deployment.selection), applied to every variant measured."""
    return smallest_holding(
        EngineOption(
            row["variant"],
            row["bytes"],
            holds=bool(row["within_budget"]),
            tie_break=row["p99_ms_batch1"],
        )
        for row in rows
        if row.get("available") and row["variant"] != TEACHER
    )


def variants_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """The one-row-per-variant view (Dagster metadata, the MLflow markdown)."""
    columns = [
        "variant",
        "precision",
        "bytes",
        "occupancy_accuracy",
        "occupancy_f1",
        "lead_gap_mae_m",
        "worst_slice",
        "worst_slice_accuracy",
        "p50_ms_batch1",
        "p99_ms_batch1",
        "throughput_fps",
        "peak_memory_mb",
        "within_budget",
        "note",
    ]
    return pd.DataFrame(report["variants"]).reindex(columns=columns)


def target_measure(
    target: DeploymentTarget,
    platform: Mapping[str, Any],
    images: Any,
    settings: DeploymentSettings,
    spec: PerceptionSpec,
) -> Measure:
    """``measure`` on the environment's target, as ``engine_benchmark`` measures engines."""
    from .reports import measure_on_target

    def measure(onnx_bytes: bytes, precision: str) -> LatencyStats:
        return measure_on_target(onnx_bytes, precision, images, platform, target, settings, spec)

    return measure
