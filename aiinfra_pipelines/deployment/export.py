"""ONNX export of a trained network, proven equivalent to it before anything else uses it.

Every later engine (FP16, INT8, TensorRT plans) derives from this graph, so an export that is
structurally invalid, lost the dynamic batch axis, or computes something else than PyTorch must
stop here, with a message naming the cause — not surface later as a "quantization regression".
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np
import onnx

from aiinfra_pipelines.perception.contract import INPUT_NAME, LEAD_GAP_OUTPUT, OCCUPANCY_OUTPUT

OUTPUTS: tuple[str, ...] = (OCCUPANCY_OUTPUT, LEAD_GAP_OUTPUT)
_OPERATOR = re.compile(r"operator '([^']+)'|namespace (\S+?::\S+?)[.\s]")


class OnnxExportError(RuntimeError):
    """The network could not be exported to a valid ONNX graph (``operator`` names the op)."""

    def __init__(self, message: str, operator: str | None = None) -> None:
        super().__init__(message)
        self.operator = operator


class ExportParityError(ValueError):
    """The exported graph computes something else than the PyTorch network."""


@dataclass(frozen=True)
class ExportedModel:
    onnx_bytes: bytes
    sha256: str
    opset: int
    max_abs_error: dict[str, float]  # per output, over batch-1 and batched runs
    parity_frames: int
    tolerance: float

    def summary(self) -> dict:
        return {
            "sha256": self.sha256,
            "bytes": len(self.onnx_bytes),
            "opset": self.opset,
            "max_abs_error": self.max_abs_error,
            "parity_frames": self.parity_frames,
            "tolerance": self.tolerance,
        }


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unsupported_operator(error: BaseException) -> str | None:
    match = _OPERATOR.search(str(error))
    return (match.group(1) or match.group(2)) if match else None


def export_network(network, opset: int) -> bytes:
    """``perception.onnx_export.export_onnx`` with failures turned into :class:`OnnxExportError`."""
    import torch

    from aiinfra_pipelines.perception.onnx_export import export_onnx

    try:
        return export_onnx(network, opset=opset)
    except torch.onnx.errors.UnsupportedOperatorError as error:
        operator = _unsupported_operator(error)
        raise OnnxExportError(
            f"ONNX export failed: operator {operator or '(unknown)'} has no ONNX opset-{opset} "
            f"equivalent; replace it in the network or register a symbolic for it ({error})",
            operator=operator,
        ) from error
    except Exception as error:  # the exporter raises bare RuntimeErrors for tracing problems
        raise OnnxExportError(f"ONNX export failed: {type(error).__name__}: {error}") from error


def check_graph(onnx_bytes: bytes) -> onnx.ModelProto:
    """``onnx.checker`` (full, with shape inference) plus the contract's names and batch axis."""
    model = onnx.load_from_string(onnx_bytes)
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise OnnxExportError(f"exported ONNX graph is invalid: {error}") from error
    inputs = {value.name: value for value in model.graph.input}
    outputs = {value.name for value in model.graph.output}
    if INPUT_NAME not in inputs or not set(OUTPUTS) <= outputs:
        raise OnnxExportError(
            f"exported graph has inputs {sorted(inputs)} and outputs {sorted(outputs)}; the "
            f"contract needs input {INPUT_NAME!r} and outputs {list(OUTPUTS)}"
        )
    batch = inputs[INPUT_NAME].type.tensor_type.shape.dim[0]
    if not batch.dim_param:
        raise OnnxExportError(
            f"exported graph fixes the batch axis to {batch.dim_value}: engines need a dynamic "
            "batch (batch 1 on the car, the serving batch offline)"
        )
    return model


def torch_outputs(network, inputs: np.ndarray) -> dict[str, np.ndarray]:
    import torch

    network = network.eval().cpu()
    with torch.inference_mode():
        occupancy, lead_gap = network(torch.from_numpy(inputs))
    return {OCCUPANCY_OUTPUT: occupancy.numpy(), LEAD_GAP_OUTPUT: lead_gap.numpy()}


def onnx_outputs(onnx_bytes: bytes, inputs: np.ndarray, batch: int) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    parts = [
        session.run(list(OUTPUTS), {INPUT_NAME: inputs[start : start + batch]})
        for start in range(0, len(inputs), batch)
    ]
    return {name: np.concatenate([p[i] for p in parts]) for i, name in enumerate(OUTPUTS)}


def export_parity(network, onnx_bytes: bytes, inputs: np.ndarray) -> dict[str, float]:
    """Max |ONNX - PyTorch| per output, running the graph at batch 1 and at the full batch."""
    reference = torch_outputs(network, inputs)
    errors = dict.fromkeys(OUTPUTS, 0.0)
    for batch in (1, len(inputs)):
        exported = onnx_outputs(onnx_bytes, inputs, batch)
        for name in OUTPUTS:
            got, want = exported[name], reference[name]
            if got.shape != want.shape:
                raise ExportParityError(
                    f"{name}: ONNX output shape {got.shape} != PyTorch {want.shape} "
                    f"at batch {batch}"
                )
            errors[name] = max(errors[name], float(np.max(np.abs(got - want))))
    return errors


def export_checked_onnx(
    network, inputs: np.ndarray, *, tolerance: float, opset: int
) -> ExportedModel:
    """Export ``network`` and prove the graph valid and numerically equal on real ``inputs``.

    Raises :class:`OnnxExportError` (unsupported operator, invalid graph, fixed batch) or
    :class:`ExportParityError` (an output differs by more than ``tolerance``).
    """
    if len(inputs) < 2:
        raise ValueError("export parity needs at least two real frames (batch 1 and batched)")
    onnx_bytes = export_network(network, opset)
    check_graph(onnx_bytes)
    errors = export_parity(network, onnx_bytes, inputs)
    breaches = {name: error for name, error in errors.items() if not error <= tolerance}
    if breaches:
        detail = ", ".join(f"{name} max |Δ| {error:.3g}" for name, error in breaches.items())
        raise ExportParityError(
            f"exported ONNX differs from PyTorch beyond {tolerance:g} on {len(inputs)} real "
            f"frames: {detail}"
        )
    return ExportedModel(
        onnx_bytes=onnx_bytes,
        sha256=sha256_hex(onnx_bytes),
        opset=opset,
        max_abs_error={name: float(error) for name, error in errors.items()},
        parity_frames=len(inputs),
        tolerance=tolerance,
    )
