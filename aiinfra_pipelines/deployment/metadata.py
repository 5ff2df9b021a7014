"""The Dagster metadata of the deployment assets: tables and JSON an operator reads in the UI.

Kept apart from the assets so each asset body says what it computes, and each table here can
be read (and changed) without the lake or the engines around it. Metadata keys are part of the
UI contract: renaming one hides its history.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.metadata_tables import markdown_table

if TYPE_CHECKING:
    from .fallback import MixedPrecisionPlan
    from .quantized import QuantizedCandidate


def fallback_steps_markdown(plan: MixedPrecisionPlan) -> str:
    """One row per step of the INT8 fallback loop: which nodes went back to FP32 and why."""
    steps = pd.DataFrame(
        [
            {
                "step": step.step,
                "fp32_nodes": ", ".join(step.fp32_nodes) or "—",
                "passed": step.passed,
                "worst": ""
                if not step.worst
                else f"{step.worst['slice']} {step.worst['metric']} "
                f"{step.worst['drop']:+.4f} (budget {step.worst['budget']})",
            }
            for step in plan.steps
        ]
    )
    return markdown_table(steps)


def sensitivity_markdown(plan: MixedPrecisionPlan) -> str:
    """The per-node quantization sensitivity ranking the fallback loop worked from."""
    return markdown_table(pd.DataFrame([entry.to_dict() for entry in plan.sensitivity]))


def quantized_metadata(candidate: QuantizedCandidate) -> dict[str, Any]:
    """``quantized_engine``'s metadata: engine hashes, the fallback story and the coverage."""
    plan = candidate.plan
    return {
        "model_version": candidate.identity.model_version,
        "int8_sha256": candidate.int8_sha256 or "none: no INT8 engine holds every slice",
        "fp16_sha256": candidate.fp16.sha256,
        "int8_path": candidate.int8_path,
        "calibration_coverage": dg.MetadataValue.json(candidate.coverage),
        **(
            {}
            if plan is None
            else {
                "fp32_nodes": dg.MetadataValue.json(plan.fp32_nodes),
                "fallback_steps": dg.MetadataValue.md(fallback_steps_markdown(plan)),
                "sensitivity": dg.MetadataValue.md(sensitivity_markdown(plan)),
            }
        ),
        **({} if candidate.qat is None else {"qat": dg.MetadataValue.json(candidate.qat)}),
        **(
            {}
            if candidate.int8_refused is None
            else {"int8_refused": candidate.int8_refused["error"]}
        ),
    }


def layerwise_markdown(report: Mapping[str, Any]) -> dict[str, str]:
    """Per precision, the layer-wise tensor comparison vs FP32 as a markdown table."""
    return {
        precision: pd.DataFrame(entry["tensors"])[
            ["tensor", "op_type", "sqnr_db", "max_abs_error", "cosine"]
        ]
        .round(4)
        .pipe(markdown_table)
        for precision, entry in report["layerwise"].items()
    }


def parity_metadata(
    report: Mapping[str, Any],
    comparison_md: str,
    benchmark_version: str,
    frames: int,
    report_key: str,
) -> dict[str, Any]:
    """``engine_parity``'s metadata: verdict, comparison table and where layers diverge."""
    layerwise = layerwise_markdown(report)
    return {
        "passed": report["passed"],
        "failures": dg.MetadataValue.json(report["failures"]),
        "ship_precision": str(report["ship_precision"]),
        "selection": dg.MetadataValue.json(report["selection"]),
        "benchmark_version": benchmark_version,
        "frames": frames,
        "comparison": dg.MetadataValue.md(comparison_md),
        "first_divergence": dg.MetadataValue.json(
            {p: entry["first_divergence"] for p, entry in report["layerwise"].items()}
        ),
        **{f"layerwise_{p}": dg.MetadataValue.md(md) for p, md in layerwise.items()},
        "report": report_key,
    }


def latency_markdown(report: Mapping[str, Any]) -> str:
    """Latency percentiles, throughput and peak memory of every engine, one row each."""
    table = pd.DataFrame(
        [
            {
                "precision": precision,
                "p50_ms": stats["p50_ms"],
                "p95_ms": stats["p95_ms"],
                "p99_ms": stats["p99_ms"],
                f"fps@{stats['serving_batch']}": round(stats["throughput_fps"], 1),
                "peak_mb": round(stats["peak_memory_mb"], 1),
            }
            for precision, stats in report["engines"].items()
        ]
    )
    return markdown_table(table)


def benchmark_metadata(report: Mapping[str, Any], target: str, report_key: str) -> dict[str, Any]:
    """``engine_benchmark``'s metadata: verdict, latency table and the budget it was held to."""
    return {
        "passed": report["passed"],
        "failures": dg.MetadataValue.json(report["failures"]),
        "target": target,
        "ship_precision": str(report["ship_precision"]),
        "platform": dg.MetadataValue.json(report["platform"]),
        "latency": dg.MetadataValue.md(latency_markdown(report)),
        "ratios_to_fp32": dg.MetadataValue.json(report["ratios"]),
        "budget": dg.MetadataValue.json(report["budget"]),
        "report": report_key,
    }
