"""The FP16 and mixed-precision INT8 engines of a candidate, staged on the run branch.

What ``quantized_engine`` computes, without Dagster around it: calibration frames checked for
coverage, the sensitivity-driven INT8 fallback loop — and quantization-aware fine-tuning when
that loop cannot hold every slice (``deployment.qat``) — the FP16 conversion, and the precision
plan recorded beside the INT8 engine so the manifest says how it was made.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
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
    from .fallback import MixedPrecisionPlan, QuantizationBudgetError
    from .qat import Int8Result


@dataclass(frozen=True)
class QuantizedCandidate:
    """The staged FP16/INT8 engines of one candidate and how the INT8 one was calibrated."""

    identity: CandidateIdentity
    fp16: StagedObject
    # None when neither PTQ nor QAT could hold every slice and the target may ship another
    # precision (``int8_refused`` says why); engine_parity then chooses among the others.
    int8: StagedObject | None
    int8_sha256: str | None
    plan: MixedPrecisionPlan | None
    precision_plan: dict[str, Any] | None
    calibration_frames: int
    coverage: Any
    # "ptq" (post-training, with sensitivity fallback), "qat" (PTQ could not hold a slice) or
    # "none" (neither could).
    int8_path: str = "ptq"
    qat: dict[str, Any] | None = None
    int8_refused: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``quantized_engine`` output as stored in the lake."""
        engines: dict[str, Any] = {"fp16": self.fp16.to_dict()}
        if self.int8 is not None:
            engines["int8"] = {**self.int8.to_dict(), "precision_plan": self.precision_plan}
        return {
            **self.identity.to_dict(),
            "calibration": {"frames": self.calibration_frames, "coverage": self.coverage},
            "engines": engines,
            **({} if self.int8_refused is None else {"int8_refused": self.int8_refused}),
        }


def precision_plan(
    plan: MixedPrecisionPlan,
    quantization: QuantizationSettings,
    target: DeploymentTarget,
    qat: Mapping[str, Any] | None = None,
    camera_input: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The INT8 plan plus the quantizer settings it ran with, as the manifest records it.

    ``path`` says which engine shipped: ``ptq`` (the plan's mixed precision) or ``qat`` (the
    plan is what PTQ tried; ``qat`` holds the fine-tune's record). ``camera_input`` says
    whether the engine takes the camera's bytes (deployment.camera_input) and why.
    """
    return {
        **plan.to_dict(),
        "path": "ptq" if qat is None else "qat",
        **({} if qat is None else {"qat": dict(qat)}),
        **({} if camera_input is None else {"camera_input": dict(camera_input)}),
        "quantization": {
            "calibrate_method": quantization.calibrate_method,
            "per_channel": quantization.per_channel,
            "activation_type": quantization.activation_type,
            "weight_type": quantization.weight_type,
            "extra_options": dict(quantization.extra_options),
            "preprocess": quantization.preprocess,
            "camera_input": quantization.camera_input,
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

    Calibration frames missing a required condition fail here. A budget neither PTQ with
    fallback nor QAT meets fails here too when the target runs only INT8; when it may run
    another precision, only the FP16 engine is staged and the refusal recorded. QAT loads the
    registered network and its training frames only when PTQ failed.
    """
    from .camera_input import with_camera_input
    from .qat import int8_with_qat_fallback
    from .quantize import convert_fp16

    settings = DeploymentSettings.load()
    target = environment_target(settings)
    quantization = settings.quantization.for_target(target)
    fp32 = read_staged(lake, onnx_model["onnx"])
    calibration = labelled_frames(calibration_frames(lake, onnx_model["dataset_version"]))
    coverage = require_calibration_coverage(calibration.tags, CalibrationGates.load().min_share)
    engine, refused = int8_or_refusal(
        lambda: int8_with_qat_fallback(
            lambda: qat_inputs(lake, onnx_model, tracking_uri),
            fp32,
            calibration,
            quantization,
            QatSettings.load(),
            deployment_gates()["quantization"],
            perception_spec(),
            opset=settings.opset,
        ),
        target,
    )
    if engine is not None and engine.path == "qat":
        context.log.warning(engine.summary())
    if refused is not None:
        context.log.warning(
            f"no INT8 engine holds every slice, so none is staged; target {target.name} may "
            f"ship {list(target.ship_precisions)}: {refused}"
        )
    camera = None
    if engine is not None and quantization.camera_input:
        camera = with_camera_input(
            engine.int8_onnx, calibration.spread(settings.parity_frames).images
        )
        context.log.info(f"INT8 camera input: {camera.note}")
    int8_onnx = camera.onnx_bytes if camera is not None else getattr(engine, "int8_onnx", None)
    fp16 = convert_fp16(fp32, keep_io_types=quantization.fp16_keep_io_types)
    version = onnx_model["model_version"]
    fp16_key, int8_key = (
        candidate_engine_key(version, "fp16"),
        candidate_engine_key(version, "int8"),
    )
    objects = {fp16_key: fp16, **({} if int8_onnx is None else {int8_key: int8_onnx})}
    staged = stage_objects(
        lake, context, objects, f"{' and '.join(sorted(objects))} of model v{version}"
    )
    plan = engine.ptq_plan if engine is not None else getattr(refused, "plan", None)
    return QuantizedCandidate(
        identity=CandidateIdentity.from_dict(onnx_model),
        fp16=staged[fp16_key],
        int8=staged.get(int8_key),
        int8_sha256=None if int8_onnx is None else hashlib.sha256(int8_onnx).hexdigest(),
        plan=plan,
        precision_plan=(
            None
            if engine is None or plan is None
            else precision_plan(
                plan, quantization, target, engine.qat, None if camera is None else camera.to_dict()
            )
        ),
        calibration_frames=len(calibration),
        coverage=coverage,
        int8_path="none" if engine is None else engine.path,
        qat=None if engine is None else engine.qat,
        int8_refused=None if refused is None else refusal_record(refused),
    )


def int8_or_refusal(
    make_int8: Callable[[], Int8Result], target: DeploymentTarget
) -> tuple[Int8Result | None, QuantizationBudgetError | None]:
    """The INT8 engine, or — when no INT8 holds every slice and the target may ship another
    precision — None and the budget error saying why.

    A target that runs only INT8 gets the error raised: no other engine could take its place.
    """
    from .fallback import QuantizationBudgetError

    try:
        return make_int8(), None
    except QuantizationBudgetError as error:
        if set(target.ship_precisions) <= {"int8"}:
            raise
        return None, error


def refusal_record(error: QuantizationBudgetError) -> dict[str, Any]:
    """Why no INT8 engine was staged, as the output and the manifest keep it: the breach, PTQ's
    fallback plan and, when QAT ran, its record."""
    return {
        "error": str(error),
        "ptq": None if error.plan is None else error.plan.to_dict(),
        "qat": getattr(error, "record", None),
    }


def qat_inputs(
    lake: VersionedLake, onnx_model: Mapping[str, Any], tracking_uri: str
) -> tuple[Any, LabelledFrames]:
    """The candidate's trained network and the train split of the dataset it learned from."""
    from aiinfra_pipelines.training.resources import load_registered_network

    (train,) = dataset_split_frames(lake, onnx_model, ("train",))
    network = load_registered_network(str(onnx_model["model_uri"]), tracking_uri)
    return network, labelled_frames(train)
