"""The onnxruntime CPU backend: the perception contract's ``OnnxRuntimeEngine`` as it is.

The same class mining, simulation and shadow mode already run, so an engine measured here is
byte for byte the engine those layers will load. Precision lives in the ONNX file (FP32, FP16,
INT8 QDQ); onnxruntime picks its kernels from the graph.
"""

from __future__ import annotations

from aiinfra_pipelines.perception.contract import PerceptionSpec
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine

NAME = "onnxruntime"


def is_available() -> tuple[bool, str]:
    try:
        import onnxruntime  # noqa: F401
    except ImportError as error:  # pragma: no cover - a hard dependency of the project
        return False, f"onnxruntime is not importable: {error}"
    return True, "onnxruntime CPUExecutionProvider"


def create(
    onnx_bytes: bytes,
    spec: PerceptionSpec,
    *,
    precision: str,
    name: str,
    batch_size: int = 64,
    intra_op_threads: int = 0,
    **_ignored,
) -> OnnxRuntimeEngine:
    engine = OnnxRuntimeEngine(
        onnx_bytes,
        spec,
        name=name,
        batch_size=batch_size,
        intra_op_threads=intra_op_threads,
    )
    engine.precision = precision
    engine.backend = NAME
    return engine
