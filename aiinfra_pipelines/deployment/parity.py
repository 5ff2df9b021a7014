"""Per-slice accuracy of an engine against the FP32 engine, with the budgets of gates.yaml.

An INT8 engine can match FP32 on average and still lose the night slice, so parity is judged
per slice (and per condition aggregate, and overall), the same table shape the offline gate
uses (``evaluation.slices``). Two kinds of metric per slice:

- label metrics (occupancy accuracy/F1, lead-gap MAE): what the quantization costs in quality;
- agreement with FP32 (share of occupancy cells decided alike, mean lead-gap difference):
  what it changes in behaviour, even where the labels cannot tell (both wrong, differently).

``drop`` is signed so positive = worse than FP32, whatever the metric's direction. A slice is
gated when it has at least ``min_slice_frames`` frames and the metric has a budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.evaluation.compare import HIGHER_IS_BETTER, budget_for
from aiinfra_pipelines.evaluation.slices import (
    DIMENSIONS,
    KIND_OVERALL,
    KIND_SLICE,
    OVERALL,
    condition_row_name,
    evaluate_by_slice,
)
from aiinfra_pipelines.perception.contract import PerceptionSpec
from aiinfra_pipelines.perception.engine import Predictions

from .frames import LabelledFrames

AGREEMENT_METRICS: dict[str, bool] = {"occupancy_agreement": True, "lead_gap_diff_m": False}
DIRECTION: dict[str, bool] = {**HIGHER_IS_BETTER, **AGREEMENT_METRICS}
TABLE_COLUMNS: tuple[str, ...] = (
    "slice",
    "kind",
    "metric",
    "frames",
    "engine",
    "fp32",
    "drop",
    "budget",
    "gated",
    "passed",
)
_TOLERANCE = 1e-9


def slice_masks(tags: pd.DataFrame) -> dict[str, tuple[str, np.ndarray]]:
    """``{row name: (kind, mask)}`` named exactly as ``evaluate_by_slice`` names its rows."""
    slices = tags["slice"].astype(str).to_numpy()
    masks: dict[str, tuple[str, np.ndarray]] = {
        name: (KIND_SLICE, slices == name) for name in sorted(set(slices))
    }
    parts = [name.split("/") for name in slices]
    if parts and all(len(p) == len(DIMENSIONS) for p in parts):
        for index, dimension in enumerate(DIMENSIONS):
            column = np.array([p[index] for p in parts])
            for value in sorted(set(column)):
                masks[condition_row_name(dimension, value)] = (dimension, column == value)
    masks[OVERALL] = (KIND_OVERALL, np.ones(len(slices), dtype=bool))
    return masks


def slice_metrics(
    frames: LabelledFrames,
    predictions: Predictions,
    reference: Predictions,
    spec: PerceptionSpec,
    threshold: float = 0.5,
) -> pd.DataFrame:
    """Label metrics (``evaluate_by_slice``) plus agreement with ``reference``, per slice row."""
    table = evaluate_by_slice(
        frames.tags,
        predictions.occupancy,
        frames.occupancy_target,
        predictions.lead_gap_m / spec.max_range_m,
        frames.lead_gap_target,
        spec.max_range_m,
        threshold=threshold,
    )
    same = (predictions.occupancy >= threshold) == (reference.occupancy >= threshold)
    cells = same.reshape(len(same), -1).mean(axis=1)
    gap_diff = np.abs(predictions.lead_gap_m - reference.lead_gap_m).astype(np.float64)
    agreement, difference = {}, {}
    for name, (_, mask) in slice_masks(frames.tags).items():
        agreement[name] = float(cells[mask].mean()) if mask.any() else float("nan")
        difference[name] = float(gap_diff[mask].mean()) if mask.any() else float("nan")
    table["occupancy_agreement"] = table["slice"].map(agreement)
    table["lead_gap_diff_m"] = table["slice"].map(difference)
    return table


@dataclass(frozen=True)
class EngineComparison:
    """One engine vs FP32 under one budget section: a long table and the verdict."""

    engine: str
    table: pd.DataFrame
    passed: bool
    failures: list[str] = field(default_factory=list)

    def gated_drops(self) -> dict[str, dict[str, float]]:
        """``{slice: {metric: drop}}`` of the gated rows (compact, for plans and reports)."""
        gated = self.table[self.table["gated"]]
        drops: dict[str, dict[str, float]] = {}
        for row in gated.itertuples(index=False):
            drops.setdefault(str(row.slice), {})[str(row.metric)] = round(float(row.drop), 5)
        return drops

    def worst(self) -> dict[str, Any] | None:
        """The gated row furthest over (or closest to) its budget."""
        gated = self.table[self.table["gated"]]
        if gated.empty:
            return None
        row = gated.assign(excess=gated["drop"] - gated["budget"]).sort_values("excess").iloc[-1]
        return {
            "slice": row["slice"],
            "metric": row["metric"],
            "drop": round(float(row["drop"]), 5),
            "budget": float(row["budget"]),
        }

    def to_records(self) -> list[dict[str, Any]]:
        return [
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in self.table.to_dict(orient="records")
        ]


def compare_with_fp32(
    engine: str,
    engine_table: pd.DataFrame,
    fp32_table: pd.DataFrame,
    section: Mapping[str, Any],
) -> EngineComparison:
    """Gate ``engine_table`` against ``fp32_table`` (both ``slice_metrics``) with ``section``.

    ``section`` is gates.yaml ``deployment.quantization`` or ``deployment.parity``:
    ``min_slice_frames``, ``budgets`` and ``slice_overrides``. Only metrics with a budget are
    compared. A slice FP32 was measured on that the engine was not is a failure.
    """
    metrics = [m for m in (section.get("budgets") or {}) if m in DIRECTION]
    unknown = sorted(set(section.get("budgets") or {}) - set(DIRECTION))
    if unknown:
        raise ValueError(f"budgets for unknown metric(s) {unknown}; known: {sorted(DIRECTION)}")
    min_frames = int(section.get("min_slice_frames", 0))
    ours = engine_table.set_index("slice")
    rows, failures = [], []
    for reference in fp32_table.itertuples(index=False):
        name = str(reference.slice)
        frames = int(reference.frames)
        for metric in metrics:
            fp32 = float(getattr(reference, metric))
            value = float(ours.loc[name, metric]) if name in ours.index else float("nan")
            budget = budget_for(name, metric, section)
            higher = DIRECTION[metric]
            drop = (fp32 - value) if higher else (value - fp32)
            gated = bool(budget is not None and frames >= min_frames and not math.isnan(fp32))
            passed = True
            if gated and math.isnan(value):
                passed = False
                failures.append(f"{engine} {name} {metric}: not measured (FP32 {fp32:.3f})")
            elif gated and not drop <= budget + _TOLERANCE:
                passed = False
                failures.append(
                    f"{engine} {name} {metric}: {value:.3f} vs FP32 {fp32:.3f} "
                    f"(drop {drop:+.3f} > budget {budget:.3f}, {frames} frames)"
                )
            rows.append(
                {
                    "slice": name,
                    "kind": str(reference.kind),
                    "metric": metric,
                    "frames": frames,
                    "engine": value,
                    "fp32": fp32,
                    "drop": drop,
                    "budget": float("nan") if budget is None else budget,
                    "gated": gated,
                    "passed": passed,
                }
            )
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    return EngineComparison(engine=engine, table=table, passed=not failures, failures=failures)


def comparison_markdown(comparisons: list[EngineComparison]) -> str:
    """A compact verdict + one row per gated slice and metric per engine, for Dagster metadata."""
    lines = []
    for comparison in comparisons:
        verdict = "PASSED" if comparison.passed else "FAILED"
        lines += [f"**{comparison.engine} vs FP32: {verdict}**", ""]
        lines += [f"- FAIL {failure}" for failure in comparison.failures[:20]]
        gated = comparison.table[comparison.table["gated"]]
        if gated.empty:
            lines += ["(no slice has enough frames to be gated)", ""]
            continue
        lines += [
            "",
            "| slice | metric | frames | engine | fp32 | drop | budget |",
            "|---" * 7 + "|",
        ]
        for row in gated.itertuples(index=False):
            flag = "" if row.passed else " **FAIL**"
            lines.append(
                f"| {row.slice} | {row.metric} | {row.frames} | {row.engine:.3f} | "
                f"{row.fp32:.3f} | {row.drop:+.4f}{flag} | {row.budget:.3f} |"
            )
        lines.append("")
    return "\n".join(lines)
