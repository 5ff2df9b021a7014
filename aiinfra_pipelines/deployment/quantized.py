"""The FP16 and mixed-precision INT8 engines of a candidate, staged on the run branch.

What ``quantized_engine`` computes, without Dagster around it: calibration frames checked for
coverage, the sensitivity-driven INT8 fallback loop — and quantization-aware fine-tuning when
that loop cannot hold every slice (``deployment.qat``) — the FP16 conversion, and the precision
plan recorded beside the INT8 engine so the manifest says how it was made.
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

from .frames import LabelledFrames, labelled_frames, require_calibration_coverage
from .payloads import StagedObject
from .settings import (
    DeploymentSettings,
    DeploymentTarget,
    QatSettings,
    QuantizationSettings,
    deployment_gates,
    environment_target,
)
from .staging import calibration_frames, dataset_split_frames, read_staged, stage_objects

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
    # "ptq" (post-training, with sensitivity fallback) or "qat" (PTQ could not hold a slice).
    int8_path: str = "ptq"
    qat: dict[str, Any] | None = None

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
    plan: MixedPrecisionPlan,
    quantization: QuantizationSettings,
    target: DeploymentTarget,
    qat: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The INT8 plan plus the quantizer settings it ran with, as the manifest records it.

    ``path`` says which engine shipped: ``ptq`` (the plan's mixed precision) or ``qat`` (the
    plan is what PTQ tried; ``qat`` holds the fine-tune's record).
    """
    return {
        **plan.to_dict(),
        "path": "ptq" if qat is None else "qat",
        **({} if qat is None else {"qat": dict(qat)}),
        "quantization": {
            "calibrate_method": quantization.calibrate_method,
            "per_channel": quantization.per_channel,
            "activation_type": quantization.activation_type,
            "weight_type": quantization.weight_type,
            "extra_options": dict(quantization.extra_options),
            "preprocess": quantization.preprocess,
            "target": target.name,
        },
    }


def quantize_candidate(
    lake: VersionedLake,
    context: dg.AssetExecutionContext,
    onnx_model: Mapping[str, Any],
    tracking_uri: str,
) -> QuantizedCandidate:
    """Quantize the staged FP32 ONNX of ``onnx_model`` and stage both engines.

    Calibration frames missing a required condition, or a budget neither PTQ with fallback
    nor QAT meets, fail here. QAT loads the registered network and its training frames only
    when PTQ failed.
    """
    from .qat import int8_with_qat_fallback
    from .quantize import convert_fp16

    settings = DeploymentSettings.load()
    target = environment_target(settings)
    quantization = settings.quantization.for_target(target)
    fp32 = read_staged(lake, onnx_model["onnx"])
    calibration = labelled_frames(calibration_frames(lake, onnx_model["dataset_version"]))
    coverage = require_calibration_coverage(calibration.tags, CalibrationGates.load().min_share)
    engine = int8_with_qat_fallback(
        lambda: qat_inputs(lake, onnx_model, tracking_uri),
        fp32,
        calibration,
        quantization,
        QatSettings.load(),
        deployment_gates()["quantization"],
        perception_spec(),
        opset=settings.opset,
    )
    if engine.path == "qat":
        context.log.warning(engine.summary())
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
    assert engine.ptq_plan is not None  # both paths record PTQ's plan
    return QuantizedCandidate(
        identity=CandidateIdentity.from_dict(onnx_model),
        fp16=staged[candidate_engine_key(version, "fp16")],
        int8=staged[candidate_engine_key(version, "int8")],
        int8_sha256=engine.sha256,
        plan=engine.ptq_plan,
        precision_plan=precision_plan(engine.ptq_plan, quantization, target, engine.qat),
        calibration_frames=len(calibration),
        coverage=coverage,
        int8_path=engine.path,
        qat=engine.qat,
    )


def qat_inputs(
    lake: VersionedLake, onnx_model: Mapping[str, Any], tracking_uri: str
) -> tuple[Any, LabelledFrames]:
    """The candidate's trained network and the train split of the dataset it learned from."""
    from aiinfra_pipelines.training.resources import load_registered_network

    (train,) = dataset_split_frames(lake, onnx_model, ("train",))
    network = load_registered_network(str(onnx_model["model_uri"]), tracking_uri)
    return network, labelled_frames(train)
