"""The FP16 and mixed-precision INT8 engines of a candidate, staged on the run branch.

What ``quantized_engine`` computes, without Dagster around it: calibration frames checked for
coverage, the sensitivity-driven INT8 fallback loop, the FP16 conversion, and the precision plan
recorded beside the INT8 engine so the manifest says how it was made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dagster as dg

from aiinfra_pipelines.datasets.settings import CalibrationGates
from aiinfra_pipelines.lake.layout import candidate_engine_key
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.training.identity import CandidateIdentity

from .frames import labelled_frames, require_calibration_coverage
from .payloads import StagedObject
from .settings import (
    DeploymentSettings,
    DeploymentTarget,
    QuantizationSettings,
    deployment_gates,
    environment_target,
)
from .staging import calibration_frames, read_staged, stage_objects

if TYPE_CHECKING:
    from .fallback import MixedPrecisionPlan


@dataclass(frozen=True)
class QuantizedCandidate:
    """The staged FP16/INT8 engines of one candidate and how the INT8 one was calibrated."""

    identity: CandidateIdentity
    fp16: StagedObject
    int8: StagedObject
    int8_sha256: str
    plan: MixedPrecisionPlan
    precision_plan: dict[str, Any]
    calibration_frames: int
    coverage: Any

    def to_dict(self) -> dict[str, Any]:
        """The ``quantized_engine`` output as stored in the lake."""
        return {
            **self.identity.to_dict(),
            "calibration": {"frames": self.calibration_frames, "coverage": self.coverage},
            "engines": {
                "fp16": self.fp16.to_dict(),
                "int8": {**self.int8.to_dict(), "precision_plan": self.precision_plan},
            },
        }


def precision_plan(
    plan: MixedPrecisionPlan, quantization: QuantizationSettings, target: DeploymentTarget
) -> dict[str, Any]:
    """The INT8 plan plus the quantizer settings it ran with, as the manifest records it."""
    return {
        **plan.to_dict(),
        "quantization": {
            "calibrate_method": quantization.calibrate_method,
            "per_channel": quantization.per_channel,
            "activation_type": quantization.activation_type,
            "weight_type": quantization.weight_type,
            "extra_options": dict(quantization.extra_options),
            "target": target.name,
        },
    }


def quantize_candidate(
    lake: VersionedLake, context: dg.AssetExecutionContext, onnx_model: Mapping[str, Any]
) -> QuantizedCandidate:
    """Quantize the staged FP32 ONNX of ``onnx_model`` and stage both engines.

    Calibration frames missing a required condition, or a budget no fallback meets, fail here.
    """
    from .fallback import mixed_precision_int8
    from .quantize import convert_fp16

    settings = DeploymentSettings.load()
    target = environment_target(settings)
    quantization = settings.quantization.for_target(target)
    fp32 = read_staged(lake, onnx_model["onnx"])
    calibration = labelled_frames(calibration_frames(lake, onnx_model["dataset_version"]))
    coverage = require_calibration_coverage(calibration.tags, CalibrationGates.load().min_share)
    engine = mixed_precision_int8(
        fp32, calibration, quantization, deployment_gates()["quantization"], perception_spec()
    )
    fp16 = convert_fp16(fp32, keep_io_types=quantization.fp16_keep_io_types)
    version = onnx_model["model_version"]
    staged = stage_objects(
        lake,
        context,
        {
            candidate_engine_key(version, "fp16"): fp16,
            candidate_engine_key(version, "int8"): engine.int8_onnx,
        },
        f"fp16 and int8 engines of model v{version}",
    )
    return QuantizedCandidate(
        identity=CandidateIdentity.from_dict(onnx_model),
        fp16=staged[candidate_engine_key(version, "fp16")],
        int8=staged[candidate_engine_key(version, "int8")],
        int8_sha256=engine.sha256,
        plan=engine.plan,
        precision_plan=precision_plan(engine.plan, quantization, target),
        calibration_frames=len(calibration),
        coverage=coverage,
    )
