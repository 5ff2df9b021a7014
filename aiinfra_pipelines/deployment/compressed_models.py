"""The models the compression report compares, made from one candidate.

The FP32, FP16 and PTQ INT8 graphs already exist (``onnx_model``, ``quantized_engine``); this
makes the rest: the teacher's FP32 graph, the car's network pruned channel by channel under
the per-slice guard (``deployment.pruning``) and fine-tuned with the training recipe, and the
QAT INT8 engine (``deployment.qat``). A variant that cannot be made is kept with the reason,
so the report says what was tried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from aiinfra_pipelines.perception.contract import PerceptionSpec

from .compression import FP16, PRUNED, PTQ, QAT, STUDENT, TEACHER, CompressionVariant
from .frames import LabelledFrames, labelled_frames


@dataclass(frozen=True)
class CandidateGraphs:
    """What the loop already made for the candidate: its FP32, FP16 and INT8 graphs."""

    fp32: bytes
    fp16: bytes
    int8: bytes | None  # None: neither PTQ nor QAT held every slice (quantized_engine)
    int8_path: str  # "ptq", "qat" or "none": how quantized_engine made the INT8 engine


def compressed_variants(
    student: Any,
    teacher: Any | None,
    graphs: CandidateGraphs,
    calibration: LabelledFrames,
    train_frames: pd.DataFrame,
    guard_frames: pd.DataFrame,
    spec: PerceptionSpec,
    *,
    training_config: Mapping[str, Any] | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> list[CompressionVariant]:
    """Every variant of the report, in its order (teacher, student, pruned, PTQ, QAT, FP16).

    ``train_frames`` are the candidate's training split (pruning fine-tunes and QAT learn on
    them), ``guard_frames`` its validation split (the pruning guard judges slices there, never
    on the benchmark the report then measures on).
    """
    from .export import export_checked_onnx
    from .pruning import prune_with_slice_guard
    from .settings import DeploymentSettings, export_tolerance

    settings = DeploymentSettings.load()
    parity_inputs = calibration.spread(settings.parity_frames).inputs()

    def export(network: Any) -> bytes:
        return export_checked_onnx(
            network, parity_inputs, tolerance=export_tolerance(), opset=settings.opset
        ).onnx_bytes

    variants = [
        CompressionVariant(STUDENT, graphs.fp32, "the candidate (car network, FP32)"),
    ]
    if teacher is None:
        variants.insert(0, CompressionVariant(TEACHER, None, "no teacher trained this cycle"))
    else:
        log("exporting the teacher")
        variants.insert(0, CompressionVariant(TEACHER, export(teacher), "cloud teacher"))

    log("pruning the car network under the per-slice guard")
    pruned = prune_with_slice_guard(
        student, train_frames, guard_frames, training_config=training_config
    )
    summary = pruned.summary()
    stopped = summary["stopped_by"] or "no breach"
    note = (
        f"step {summary['kept_step']} of {summary['steps_run']}, "
        f"{summary['macs_ratio']:.2f}x MACs, {summary['parameters_ratio']:.2f}x parameters; "
        f"stopped by {stopped}"
    )
    variants.append(CompressionVariant(PRUNED, export(pruned.network), note))

    if graphs.int8 is None:
        # quantized_engine tried PTQ and then QAT; neither held, so neither is measured again.
        variants.append(CompressionVariant(PTQ, None, "PTQ could not hold every slice"))
        variants.append(CompressionVariant(QAT, None, "QAT could not hold every slice"))
    elif graphs.int8_path == "qat":
        # PTQ could not hold a slice, so quantized_engine made QAT's engine already.
        variants.append(CompressionVariant(PTQ, None, "PTQ could not hold every slice"))
        variants.append(CompressionVariant(QAT, graphs.int8, "the loop's INT8 engine"))
    else:
        variants.append(CompressionVariant(PTQ, graphs.int8, "the loop's INT8 engine"))
        log("quantization-aware fine-tuning")
        variants.append(_qat_variant(student, graphs.fp32, train_frames, calibration, spec))
    variants.append(CompressionVariant(FP16, graphs.fp16, "FP16 conversion"))
    return variants


def _qat_variant(
    student: Any,
    fp32: bytes,
    train_frames: pd.DataFrame,
    calibration: LabelledFrames,
    spec: PerceptionSpec,
) -> CompressionVariant:
    """QAT's engine for comparison (when PTQ held, nothing shipped it), or why there is none."""
    from .qat import QatBudgetError, qat_int8
    from .settings import DeploymentSettings, QatSettings, deployment_gates

    try:
        qat = qat_int8(
            student,
            labelled_frames(train_frames, spec),
            calibration,
            QatSettings.load(),
            deployment_gates()["quantization"],
            spec,
            opset=DeploymentSettings.load().opset,
            fp32_onnx=fp32,
        )
    except QatBudgetError as error:
        return CompressionVariant(QAT, None, f"QAT breached its budget: {error}"[:300])
    return CompressionVariant(QAT, qat.int8_onnx, f"QAT, {qat.record.get('epochs')} epoch(s)")
