"""Layer-wise comparison of an engine with its FP32 graph, tensor by tensor, on onnxruntime.

When an engine's outputs drift, the question is *where* it starts: every intermediate tensor
the FP32 graph computes (that the engine also computes under the same name — QDQ and FP16
conversion keep the names) is exposed as an extra graph output in both models, both run on the
same real frames, and each tensor pair is scored (SQNR, max/mean absolute error, cosine). The
same machinery measures per-node quantization sensitivity.

Tensor names map to the FP32 node that produced them. In a QDQ graph the engine side of a tensor
is what the next layer reads — its dequantized value (``consumed_view``) — so an activation
folded into its producer (Conv+Relu) is compared after the clamp its quantizer applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from aiinfra_pipelines.perception.contract import (
    INPUT_NAME,
    input_to_images,
    session_takes_camera_bytes,
)

if TYPE_CHECKING:  # onnx loads where a comparison runs, not with the code location
    import onnx

# SQNR of an exact match is infinite; reports carry a finite ceiling (float32 noise is ~140 dB).
SQNR_CEILING_DB = 150.0
COLUMNS: tuple[str, ...] = (
    "order",
    "tensor",
    "node",
    "op_type",
    "sqnr_db",
    "max_abs_error",
    "mean_abs_error",
    "cosine",
)


@dataclass(frozen=True)
class ProducedTensor:
    tensor: str
    node: str
    op_type: str


def sqnr_db(reference: np.ndarray, approximation: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB (higher = closer; capped at the ceiling)."""
    reference = np.asarray(reference, dtype=np.float64)
    noise = float(np.sum((reference - np.asarray(approximation, dtype=np.float64)) ** 2))
    signal = float(np.sum(reference**2))
    if noise == 0.0:
        return SQNR_CEILING_DB
    if signal == 0.0:
        return -SQNR_CEILING_DB
    return float(min(SQNR_CEILING_DB, 10.0 * math.log10(signal / noise)))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return 1.0 if norm == 0.0 else float(np.dot(a, b) / norm)


def activation_tensors(model: onnx.ModelProto) -> list[ProducedTensor]:
    """Tensors computed from the model input, in graph (topological) order.

    Outputs of nodes that only transform constants (Identity of a weight, shape constants) are
    not activations and would only pad the report; nor are shape computations on the input
    (``Shape`` of the batch and what derives from it alone), which are integers, not signals.
    """
    dynamic = {value.name for value in model.graph.input}
    shape_only: set[str] = set()  # the batch size and what is computed from it alone
    produced: list[ProducedTensor] = []
    for node in model.graph.node:
        inputs = [name for name in node.input if name in dynamic]
        if not inputs:
            continue
        if node.op_type == "Shape" or all(name in shape_only for name in inputs):
            shape_only.update(output for output in node.output if output)
            dynamic.update(output for output in node.output if output)
            continue
        for output in node.output:
            if output:
                dynamic.add(output)
                produced.append(ProducedTensor(output, node.name, node.op_type))
    return produced


def expose(onnx_bytes: bytes, tensors: list[str]) -> bytes:
    """The model with ``tensors`` added as graph outputs (onnxruntime infers their types)."""
    import onnx

    model = onnx.load_from_string(onnx_bytes)
    present = {value.name for value in model.graph.output}
    for name in tensors:
        if name not in present:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
            present.add(name)
    return model.SerializeToString()


def run_tensors(
    onnx_bytes: bytes,
    tensors: list[str],
    inputs: np.ndarray,
    batch_size: int = 32,
    intra_op_threads: int = 0,
) -> dict[str, np.ndarray]:
    """Values of ``tensors`` (float32) for ``inputs``, concatenated over batches."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    session = ort.InferenceSession(
        expose(onnx_bytes, tensors), sess_options=options, providers=["CPUExecutionProvider"]
    )
    if session_takes_camera_bytes(session):
        # A camera-input INT8 graph (deployment.camera_input) takes the frames as bytes.
        inputs = input_to_images(inputs)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in tensors}
    for start in range(0, len(inputs), batch_size):
        values = session.run(tensors, {INPUT_NAME: inputs[start : start + batch_size]})
        for name, value in zip(tensors, values, strict=True):
            parts[name].append(np.asarray(value, dtype=np.float32))
    return {name: np.concatenate(chunks) for name, chunks in parts.items()}


def compare_tensors(reference: np.ndarray, approximation: np.ndarray) -> dict[str, float]:
    error = np.abs(reference.astype(np.float64) - approximation.astype(np.float64))
    return {
        "sqnr_db": sqnr_db(reference, approximation),
        "max_abs_error": float(error.max()) if error.size else 0.0,
        "mean_abs_error": float(error.mean()) if error.size else 0.0,
        "cosine": _cosine(reference, approximation),
    }


def consumed_view(model: onnx.ModelProto) -> dict[str, str]:
    """Tensor → the tensor its consumers actually read in a QDQ graph.

    A QDQ graph quantizes an activation ``T`` as ``DequantizeLinear(QuantizeLinear(T))``; the
    next layer reads the dequantized value, and a Relu folded into its producer only takes
    effect there (the Q clamps at its zero point). So the engine side of ``T`` is the DQ
    output when there is one, ``T`` itself otherwise (FP16 and FP32 graphs).
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    view: dict[str, str] = {}
    for node in model.graph.node:
        for tensor in node.output:
            view[tensor] = tensor
            for quantize in consumers.get(tensor, []):
                if quantize.op_type != "QuantizeLinear" or quantize.input[0] != tensor:
                    continue
                dequantized = [
                    n
                    for n in consumers.get(quantize.output[0], [])
                    if n.op_type == "DequantizeLinear"
                ]
                if dequantized:
                    view[tensor] = dequantized[0].output[0]
                    break
    return view


def layerwise_comparison(
    reference_onnx: bytes,
    engine_onnx: bytes,
    inputs: np.ndarray,
    batch_size: int = 32,
) -> pd.DataFrame:
    """One row per activation tensor both graphs compute: how far the engine is from FP32.

    Columns: ``order`` (position in the FP32 graph), ``tensor``, ``node``/``op_type`` (its FP32
    producer), ``sqnr_db``, ``max_abs_error``, ``mean_abs_error``, ``cosine``.
    """
    import onnx

    reference_model = onnx.load_from_string(reference_onnx)
    view = consumed_view(onnx.load_from_string(engine_onnx))
    shared = [t for t in activation_tensors(reference_model) if t.tensor in view]
    names = [t.tensor for t in shared]
    if not names:
        return pd.DataFrame(columns=list(COLUMNS))
    reference = run_tensors(reference_onnx, names, inputs, batch_size)
    engine_names = list(dict.fromkeys(view[name] for name in names))
    engine = run_tensors(engine_onnx, engine_names, inputs, batch_size)
    rows = []
    for order, produced in enumerate(shared):
        ref, got = reference[produced.tensor], engine[view[produced.tensor]]
        if ref.shape != got.shape:
            continue
        rows.append(
            {
                "order": order,
                "tensor": produced.tensor,
                "node": produced.node,
                "op_type": produced.op_type,
                **compare_tensors(ref, got),
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def first_divergence(table: pd.DataFrame, flag_sqnr_db: float) -> dict | None:
    """The earliest tensor whose SQNR falls below ``flag_sqnr_db`` (where to start debugging)."""
    flagged = table[table["sqnr_db"] < flag_sqnr_db]
    if flagged.empty:
        return None
    row = flagged.sort_values("order").iloc[0]
    return {
        "tensor": row["tensor"],
        "node": row["node"],
        "sqnr_db": round(float(row["sqnr_db"]), 2),
    }
