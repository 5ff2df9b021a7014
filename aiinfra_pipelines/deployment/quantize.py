"""Post-training quantization with onnxruntime: INT8 QDQ calibrated on real frames, and FP16.

A :class:`QuantizationWorkspace` calibrates activation ranges once on the calibration frames
and then produces any number of variants of the same model — everything INT8, everything but
some nodes, or only one node (for sensitivity analysis) — from those same ranges. The variants
differ only in which nodes carry Q/DQ pairs, so the fallback loop compares like with like, and
the same model plus the same calibration frames always give byte-identical ONNX.

QDQ (QuantizeLinear/DequantizeLinear around float ops) rather than QOperator: the same file
runs on onnxruntime's CPU INT8 kernels and is TensorRT's input for explicit quantization.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from aiinfra_pipelines.perception.contract import INPUT_NAME

from .settings import QuantizationSettings

_PREPROCESS_HINT = "Please consider to run pre-processing before quantization"


@dataclass(frozen=True)
class QuantizableNode:
    name: str
    op_type: str
    output: str  # the node's (first) output tensor in the FP32 graph


def quantizable_nodes(fp32_onnx: bytes, op_types: Sequence[str]) -> list[QuantizableNode]:
    """Nodes of ``op_types`` in graph order: the candidates for keeping in FP32."""
    model = onnx.load_from_string(fp32_onnx)
    nodes = [
        QuantizableNode(node.name, node.op_type, node.output[0])
        for node in model.graph.node
        if node.op_type in set(op_types)
    ]
    unnamed = [node.op_type for node in nodes if not node.name]
    if unnamed:
        raise ValueError(f"{len(unnamed)} {unnamed[0]} node(s) have no name: cannot exclude them")
    return nodes


def _calibration_reader(inputs: np.ndarray, batch_size: int):
    from onnxruntime.quantization import CalibrationDataReader

    class _Frames(CalibrationDataReader):
        """Real calibration frames in fixed batches, in order (deterministic ranges)."""

        def __init__(self) -> None:
            self._starts = iter(range(0, len(inputs), batch_size))

        def get_next(self) -> dict[str, np.ndarray] | None:
            start = next(self._starts, None)
            if start is None:
                return None
            return {INPUT_NAME: np.ascontiguousarray(inputs[start : start + batch_size])}

    return _Frames()


class _DropPreprocessHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _PREPROCESS_HINT not in record.getMessage()


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """onnxruntime suggests its optional pre-processing on every call; whether it runs is
    deployment.yaml's ``preprocess`` (per target), so the hint says nothing the settings do not."""
    root = logging.getLogger()
    hint = _DropPreprocessHint()
    root.addFilter(hint)
    try:
        yield
    finally:
        root.removeFilter(hint)


def _preprocess(fp32_path: Path) -> None:
    """Replace ``fp32_path`` by onnxruntime's ``quant_pre_process`` of it (shape inference and
    basic graph optimizations, standard ONNX operators only).

    Why: the mirror pass runs the same weights twice, and the exporter feeds the second use
    through ``Identity`` nodes the quantizer cannot treat as constant weights, so those Conv/Gemm
    stay float between Q/DQ pairs and INT8 only adds work. Optimized, every weight is an
    initializer again, and with U8S8 onnxruntime fuses every quantized Conv/Gemm into one
    integer kernel (deployment.yaml ``targets.cpu-ci``). Node names survive, so a fallback plan
    names the same nodes either way.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    exported = fp32_path.with_name("exported.onnx")
    fp32_path.rename(exported)
    quant_pre_process(str(exported), str(fp32_path))
    exported.unlink()


class QuantizationWorkspace:
    """Quantized variants of one FP32 model from one calibration pass.

    Use as a context manager (it owns a temporary directory for onnxruntime's files).
    """

    def __init__(
        self, fp32_onnx: bytes, calibration_inputs: np.ndarray, settings: QuantizationSettings
    ) -> None:
        if len(calibration_inputs) == 0:
            raise ValueError("no calibration frames: INT8 ranges cannot be fixed without data")
        self.fp32_onnx = fp32_onnx
        self.settings = settings
        self._inputs = calibration_inputs
        self._directory: Path | None = None

    def __enter__(self) -> QuantizationWorkspace:
        self._directory = Path(tempfile.mkdtemp(prefix="aiinfra-quant-"))
        (self._directory / "fp32.onnx").write_bytes(self.fp32_onnx)
        if self.settings.preprocess:
            _preprocess(self._directory / "fp32.onnx")
        return self

    def __exit__(self, *exc_info) -> None:
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def quantize(self, *, exclude: Sequence[str] = (), only: Sequence[str] | None = None) -> bytes:
        """INT8 QDQ bytes with every candidate quantized except ``exclude`` (or only ``only``)."""
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )

        if self._directory is None:
            raise RuntimeError("QuantizationWorkspace must be used as a context manager")
        settings = self.settings
        output = self._directory / "int8.onnx"
        cache = self._directory / "calibration.json"
        arguments = {
            "quant_format": QuantFormat.QDQ,
            "per_channel": settings.per_channel,
            "activation_type": QuantType[settings.activation_type],
            "weight_type": QuantType[settings.weight_type],
            "calibrate_method": CalibrationMethod[settings.calibrate_method],
            "nodes_to_exclude": list(exclude),
            "nodes_to_quantize": list(only or []),
            "extra_options": _extra_options(settings),
        }
        if only is not None and not only:
            raise ValueError("only=[] would quantize every node; pass None for that")
        if "calibration_cache_path" in inspect.signature(quantize_static).parameters:
            arguments["calibration_cache_path"] = str(cache)  # ranges computed once, reused
        with _quiet_quantizer():
            quantize_static(
                str(self._directory / "fp32.onnx"),
                str(output),
                _calibration_reader(self._inputs, settings.calibration_batch_size),
                **arguments,
            )
        data = output.read_bytes()
        output.unlink()
        return data


def _extra_options(settings: QuantizationSettings) -> dict:
    """quantize_static's extra_options; with camera input, the input's quantization is pinned
    to the camera's (deployment.camera_input), whatever range the calibration frames span."""
    options = dict(settings.extra_options)
    if settings.camera_input:
        from .camera_input import input_quant_overrides

        overrides = dict(options.get("TensorQuantOverrides", {}))
        overrides.update(input_quant_overrides())
        options["TensorQuantOverrides"] = overrides
    return options


def quantize_int8(
    fp32_onnx: bytes,
    calibration_inputs: np.ndarray,
    settings: QuantizationSettings,
    exclude: Sequence[str] = (),
) -> bytes:
    """One INT8 QDQ model (every candidate quantized but ``exclude``)."""
    with QuantizationWorkspace(fp32_onnx, calibration_inputs, settings) as workspace:
        return workspace.quantize(exclude=exclude)


def convert_fp16(fp32_onnx: bytes, keep_io_types: bool = True) -> bytes:
    """The FP16 engine: weights and activations in half precision, I/O optionally float32."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load_from_string(fp32_onnx), keep_io_types=keep_io_types)
    return model.SerializeToString()
