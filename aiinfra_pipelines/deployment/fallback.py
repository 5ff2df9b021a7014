"""The mixed-precision fallback loop: INT8 everywhere the per-slice budget allows, FP32 elsewhere.

Step 0 quantizes every candidate node. While some gated slice drops more than its budget
(gates.yaml ``deployment.quantization``) against the FP32 engine on the calibration frames, the
most sensitive node still in INT8 (``sensitivity.rank_sensitivity``) goes back to FP32 — one
node per step, so the plan keeps as much INT8 as the budget permits and the record shows what
each step bought. The loop fails, naming the breaching slices, when the budget still does not
hold after ``max_fp32_nodes`` fallbacks (or with every candidate back in FP32): such a model
needs a fix upstream, not a silently FP32 "INT8" engine.

Everything runs on onnxruntime with the calibration frames as they are labelled, so the loop is
deterministic: the same model and frames always choose the same plan and the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from aiinfra_pipelines.perception.contract import PerceptionSpec
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine, Predictions

from .export import sha256_hex
from .frames import LabelledFrames
from .parity import EngineComparison, compare_with_fp32, slice_masks, slice_metrics
from .quantize import QuantizationWorkspace, quantizable_nodes
from .sensitivity import NodeSensitivity, rank_sensitivity
from .settings import QuantizationSettings


@dataclass(frozen=True)
class FallbackStep:
    step: int
    fp32_nodes: list[str]
    passed: bool
    failures: list[str]
    drops: dict[str, dict[str, float]]  # gated slice -> metric -> drop vs FP32
    worst: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "fp32_nodes": list(self.fp32_nodes),
            "passed": self.passed,
            "failures": list(self.failures),
            "worst": self.worst,
            "drops": self.drops,
        }


@dataclass(frozen=True)
class MixedPrecisionPlan:
    """Which nodes run in INT8, which fell back to FP32, and why (the steps that led there)."""

    candidates: list[str]
    sensitivity: list[NodeSensitivity]
    steps: list[FallbackStep]
    fp32_nodes: list[str]
    metric: str
    calibration_frames: int
    max_fp32_nodes: int
    passed: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def int8_nodes(self) -> list[str]:
        return [node for node in self.candidates if node not in self.fp32_nodes]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "sensitivity_metric": self.metric,
            "calibration_frames": self.calibration_frames,
            "max_fp32_nodes": self.max_fp32_nodes,
            "candidates": list(self.candidates),
            "int8_nodes": self.int8_nodes,
            "fp32_nodes": list(self.fp32_nodes),
            "sensitivity": [entry.to_dict() for entry in self.sensitivity],
            "steps": [step.to_dict() for step in self.steps],
            **self.extra,
        }


@dataclass(frozen=True)
class MixedPrecisionEngine:
    int8_onnx: bytes
    sha256: str
    plan: MixedPrecisionPlan
    comparison: EngineComparison  # the final step's comparison on the calibration frames


class QuantizationBudgetError(ValueError):
    """No fallback within ``max_fp32_nodes`` brings every gated slice within budget."""

    def __init__(self, message: str, plan: MixedPrecisionPlan) -> None:
        super().__init__(message)
        self.plan = plan


def predict_frames(onnx_bytes: bytes, frames: LabelledFrames, spec: PerceptionSpec) -> Predictions:
    """``onnx_bytes`` run on onnxruntime over ``frames`` (the gates compare these readings)."""
    return OnnxRuntimeEngine(onnx_bytes, spec, name="calibration").infer(frames.images)


def mixed_precision_int8(
    fp32_onnx: bytes,
    calibration: LabelledFrames,
    settings: QuantizationSettings,
    budget_section: Mapping[str, Any],
    spec: PerceptionSpec,
) -> MixedPrecisionEngine:
    """Quantize ``fp32_onnx`` to INT8 QDQ, falling back node by node until the budget holds.

    ``budget_section`` is gates.yaml ``deployment.quantization`` (``budgets``,
    ``slice_overrides``, ``min_slice_frames``, ``max_fp32_nodes``). Raises
    :class:`QuantizationBudgetError` (with the plan so far) when no allowed fallback suffices.
    """
    max_fp32 = int(budget_section.get("max_fp32_nodes", 0))
    min_frames = int(budget_section.get("min_slice_frames", 0))
    candidates = quantizable_nodes(fp32_onnx, settings.candidate_op_types)
    if not candidates:
        raise ValueError(
            f"the model has no {'/'.join(settings.candidate_op_types)} node to quantize"
        )
    inputs = calibration.inputs()
    reference = predict_frames(fp32_onnx, calibration, spec)
    fp32_table = slice_metrics(calibration, reference, reference, spec)
    with QuantizationWorkspace(fp32_onnx, inputs, settings) as workspace:
        groups = {
            name: mask
            for name, (_, mask) in slice_masks(calibration.tags).items()
            if mask.sum() >= min_frames
        }
        ranking = rank_sensitivity(
            workspace, candidates, inputs, settings.sensitivity_metric, groups
        )
        search = _FallbackSearch(calibration, reference, fp32_table, budget_section, spec)
        int8, comparison = search.run(workspace, [entry.node for entry in ranking], max_fp32)
    steps, fp32_nodes, remaining = search.steps, search.fp32_nodes, search.remaining
    plan = MixedPrecisionPlan(
        candidates=[node.name for node in candidates],
        sensitivity=ranking,
        steps=steps,
        fp32_nodes=list(fp32_nodes),
        metric=settings.sensitivity_metric,
        calibration_frames=len(calibration),
        max_fp32_nodes=max_fp32,
        passed=comparison.passed,
    )
    if not comparison.passed:
        raise QuantizationBudgetError(
            _budget_breach(comparison.failures, len(calibration), fp32_nodes, remaining, max_fp32),
            plan,
        )
    return MixedPrecisionEngine(
        int8_onnx=int8, sha256=sha256_hex(int8), plan=plan, comparison=comparison
    )


class _FallbackSearch:
    """Quantize, compare every slice with FP32, and put the most sensitive node still in INT8
    back to FP32, until the budget holds, no node is left or ``max_fp32_nodes`` is reached."""

    def __init__(
        self,
        calibration: LabelledFrames,
        reference: Predictions,
        fp32_table: pd.DataFrame,
        budget_section: Mapping[str, Any],
        spec: PerceptionSpec,
    ) -> None:
        self.calibration, self.reference, self.fp32_table = calibration, reference, fp32_table
        self.budget_section, self.spec = budget_section, spec
        self.steps: list[FallbackStep] = []
        self.fp32_nodes: list[str] = []
        self.remaining: list[str] = []

    def run(
        self, workspace: QuantizationWorkspace, ranked_nodes: list[str], max_fp32: int
    ) -> tuple[bytes, EngineComparison]:
        """The last INT8 engine tried and its comparison with FP32."""
        while True:
            int8 = workspace.quantize(exclude=self.fp32_nodes)
            comparison = self._compare(int8)
            self.remaining = [node for node in ranked_nodes if node not in self.fp32_nodes]
            if comparison.passed or not self.remaining or len(self.fp32_nodes) >= max_fp32:
                return int8, comparison
            self.fp32_nodes.append(self.remaining[0])

    def _compare(self, int8: bytes) -> EngineComparison:
        predictions = predict_frames(int8, self.calibration, self.spec)
        table = slice_metrics(self.calibration, predictions, self.reference, self.spec)
        comparison = compare_with_fp32("int8", table, self.fp32_table, self.budget_section)
        self.steps.append(
            FallbackStep(
                step=len(self.steps),
                fp32_nodes=list(self.fp32_nodes),
                passed=comparison.passed,
                failures=comparison.failures,
                drops=comparison.gated_drops(),
                worst=comparison.worst(),
            )
        )
        return comparison


def _budget_breach(
    failures: list[str],
    calibration_frames: int,
    fp32_nodes: list[str],
    remaining: list[str],
    max_fp32: int,
) -> str:
    """Why no fallback can fix the INT8 engine: what was tried, and the first breaches."""
    if not remaining:
        why = "with every candidate node back in FP32"
    elif not fp32_nodes:
        why = f"and no node may fall back (deployment.quantization.max_fp32_nodes = {max_fp32})"
    else:
        why = (
            f"with the {len(fp32_nodes)} most sensitive node(s) in FP32 "
            f"(deployment.quantization.max_fp32_nodes = {max_fp32})"
        )
    shown = "; ".join(failures[:5])
    more = f" (+{len(failures) - 5} more)" if len(failures) > 5 else ""
    return (
        f"INT8 engine still breaches the per-slice budget on {calibration_frames} calibration "
        f"frames {why}; no fallback can fix it: {shown}{more}"
    )
