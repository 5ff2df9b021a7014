"""The TensorRT backend: a plan built from the engine's ONNX on a CUDA device, run on it.

Precision comes from the ONNX itself — the FP16 graph for FP16, the INT8 QDQ graph for INT8
(explicit quantization: TensorRT keeps exactly the Q/DQ placement the fallback loop chose, so
nodes the plan kept in FP32 stay FP32). Networks are built strongly typed where TensorRT offers
it (always in 11.x, where the FP16/INT8 builder flags no longer exist); older builds without
strong typing get the FP16/INT8 builder flags instead.

A plan only runs on the TensorRT version and GPU compute capability it was built with, so every
plan file carries a header with both (plus the ONNX hash it came from); :func:`read_plan_file`
refuses a plan built elsewhere with a message saying so, before TensorRT fails obscurely.
The builder's timing cache persists beside the plans, so rebuilding a model of the same shapes
skips most tactic timing.

Inference uses torch CUDA tensors as device buffers (the named-tensor API of TensorRT 10+:
``set_input_shape`` / ``set_tensor_address`` / ``execute_async_v3`` on torch's stream).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiinfra_pipelines.perception.contract import (
    EMBEDDING_OUTPUT,
    INPUT_NAME,
    LEAD_GAP_OUTPUT,
    OCCUPANCY_OUTPUT,
    PerceptionSpec,
    images_to_input,
)
from aiinfra_pipelines.perception.engine import Predictions, outputs_to_predictions

NAME = "tensorrt"
PLAN_MAGIC = b"AIINFRA-TRT-PLAN1\n"
PLAN_SUFFIX = ".plan"


class TensorRTError(RuntimeError):
    """A plan could not be built or run."""


class IncompatiblePlanError(TensorRTError):
    """The plan was built for another TensorRT version or GPU compute capability."""


@dataclass(frozen=True)
class Platform:
    """What a plan is bound to: TensorRT version and GPU compute capability (``"8.7"``)."""

    tensorrt_version: str
    compute_capability: str
    device_name: str = ""


# -- availability and platform -------------------------------------------------------------


def is_available() -> tuple[bool, str]:
    try:
        import tensorrt as trt
    except ImportError as error:
        return False, f"tensorrt is not importable ({error}); install the [gpu] extra"
    try:
        import torch
    except ImportError as error:  # pragma: no cover - torch is a project dependency
        return False, f"torch is not importable: {error}"
    if not torch.cuda.is_available():
        return False, "no CUDA device visible (torch.cuda.is_available() is False)"
    return True, f"TensorRT {trt.__version__} on {torch.cuda.get_device_name()}"


def current_platform(device: int = 0) -> Platform:
    import tensorrt as trt
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return Platform(
        tensorrt_version=str(trt.__version__),
        compute_capability=f"{major}.{minor}",
        device_name=torch.cuda.get_device_name(device),
    )


# -- plan files ----------------------------------------------------------------------------


def write_plan_file(plan: bytes, header: dict[str, Any]) -> bytes:
    """``PLAN_MAGIC`` + 4-byte header length + JSON header + TensorRT's serialized plan."""
    encoded = json.dumps(
        {**header, "plan_sha256": hashlib.sha256(plan).hexdigest()}, sort_keys=True
    ).encode()
    return PLAN_MAGIC + struct.pack(">I", len(encoded)) + encoded + plan


def read_plan_file(data: bytes, platform: Platform | None) -> tuple[dict[str, Any], bytes]:
    """(header, serialized plan); refuses a plan built for another TensorRT or GPU.

    ``platform=None`` skips the compatibility check (for inspecting a plan on a machine that
    cannot run it).
    """
    if not data.startswith(PLAN_MAGIC):
        raise TensorRTError("not an aiinfra TensorRT plan file (missing header)")
    offset = len(PLAN_MAGIC)
    (length,) = struct.unpack(">I", data[offset : offset + 4])
    header = json.loads(data[offset + 4 : offset + 4 + length])
    plan = data[offset + 4 + length :]
    if hashlib.sha256(plan).hexdigest() != header.get("plan_sha256"):
        raise TensorRTError("TensorRT plan file is corrupt: its plan does not match its hash")
    if platform is not None:
        built = (header.get("tensorrt_version"), header.get("compute_capability"))
        here = (platform.tensorrt_version, platform.compute_capability)
        if built != here:
            raise IncompatiblePlanError(
                f"TensorRT plan was built with TensorRT {built[0]} for compute capability "
                f"{built[1]} ({header.get('device_name') or 'unknown GPU'}); this machine has "
                f"TensorRT {here[0]} on compute capability {here[1]} "
                f"({platform.device_name or 'unknown GPU'}). A plan only runs where it was "
                "built: rebuild it from the ONNX on the target."
            )
    return header, plan


def plan_cache_key(onnx_sha256: str, precision: str, platform: Platform, shapes: str) -> str:
    version = platform.tensorrt_version.replace(".", "_")
    capability = platform.compute_capability.replace(".", "")
    return f"{onnx_sha256[:16]}-{precision}-{shapes}-sm{capability}-trt{version}"


# -- quantized graphs TensorRT can take ----------------------------------------------------


def tensorrt_quantization_problems(onnx_bytes: bytes) -> list[str]:
    """Why TensorRT's explicit quantization would reject this QDQ graph (empty when it will not).

    TensorRT quantizes symmetrically (every zero point 0) and takes int8 Q/DQ only, no int32
    bias dequantization; onnxruntime's CPU-tuned defaults (asymmetric activations, quantized
    biases) violate both. Quantize with ``ActivationSymmetric`` and ``QuantizeBias: false``
    (the tensorrt targets in deployment.yaml) for a graph both runtimes accept.
    """
    import onnx  # not at import time: every run process loads the code location
    from onnx import numpy_helper

    model = onnx.load_from_string(onnx_bytes)
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    problems = []
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3:
            continue
        zero_point = initializers.get(node.input[2])
        if zero_point is None:
            continue
        values = numpy_helper.to_array(zero_point)
        if values.dtype == np.int32:
            problems.append(f"{node.name}: int32 (bias) dequantization")
        elif np.any(values != 0):
            problems.append(f"{node.name}: asymmetric quantization (zero point != 0)")
    return problems


# -- building ------------------------------------------------------------------------------


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def build_plan(
    onnx_bytes: bytes,
    spec: PerceptionSpec,
    *,
    precision: str,
    opt_batch: int,
    max_batch: int,
    workspace_mb: int,
    timing_cache: Path | None,
) -> bytes:
    """Build a plan file (header + plan) for the current GPU from ``onnx_bytes``."""
    import tensorrt as trt

    if precision == "int8":
        problems = tensorrt_quantization_problems(onnx_bytes)
        if problems:
            raise TensorRTError(
                f"the INT8 graph is not TensorRT-compatible ({len(problems)} Q/DQ node(s), e.g. "
                f"{problems[0]}): quantize it with ActivationSymmetric and QuantizeBias: false"
            )
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    creation = trt.NetworkDefinitionCreationFlag
    strongly_typed = hasattr(creation, "STRONGLY_TYPED")
    network = builder.create_network(1 << int(creation.STRONGLY_TYPED) if strongly_typed else 0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise TensorRTError(f"TensorRT could not parse the {precision} ONNX: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb) << 20)
    if not strongly_typed:  # TensorRT without strong typing: precision by builder flags
        if precision in ("fp16", "int8"):
            config.set_flag(trt.BuilderFlag.FP16)
        if precision == "int8":
            config.set_flag(trt.BuilderFlag.INT8)
    shape = (3, spec.image_height, spec.image_width)
    profile = builder.create_optimization_profile()
    profile.set_shape(
        INPUT_NAME, (1, *shape), (min(opt_batch, max_batch), *shape), (max_batch, *shape)
    )
    config.add_optimization_profile(profile)
    cache_bytes = timing_cache.read_bytes() if timing_cache and timing_cache.is_file() else b""
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TensorRTError(f"TensorRT failed to build the {precision} plan (see its log)")
    if timing_cache is not None:
        _atomic_write(timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
    platform = current_platform()
    header = {
        "tensorrt_version": platform.tensorrt_version,
        "compute_capability": platform.compute_capability,
        "device_name": platform.device_name,
        "precision": precision,
        "strongly_typed": strongly_typed,
        "onnx_sha256": hashlib.sha256(onnx_bytes).hexdigest(),
        "profile": {"min": 1, "opt": min(opt_batch, max_batch), "max": max_batch},
    }
    return write_plan_file(bytes(memoryview(serialized)), header)


# -- running -------------------------------------------------------------------------------


def _torch_dtype(trt_dtype):
    import tensorrt as trt
    import torch

    table = {
        trt.DataType.FLOAT: torch.float32,
        trt.DataType.HALF: torch.float16,
        trt.DataType.INT8: torch.int8,
        trt.DataType.INT32: torch.int32,
        trt.DataType.BOOL: torch.bool,
    }
    for name, dtype in (("BF16", torch.bfloat16), ("INT64", torch.int64)):
        if hasattr(trt.DataType, name):
            table[getattr(trt.DataType, name)] = dtype
    return table[trt_dtype]


class TensorRTEngine:
    """A deserialized plan on one CUDA device behind the perception ``Engine`` interface."""

    backend = NAME

    def __init__(
        self,
        plan_file: bytes,
        spec: PerceptionSpec,
        *,
        name: str,
        batch_size: int = 64,
        device: int = 0,
    ) -> None:
        import tensorrt as trt
        import torch

        self.header, plan = read_plan_file(plan_file, current_platform(device))
        self.spec = spec
        self.name = name
        self.precision = str(self.header.get("precision", ""))
        self.sha256 = hashlib.sha256(plan_file).hexdigest()
        self.onnx_sha256 = str(self.header.get("onnx_sha256", ""))
        self.max_batch = int(self.header["profile"]["max"])
        self.batch_size = min(batch_size, self.max_batch)
        self.device = torch.device("cuda", device)
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            raise TensorRTError(f"TensorRT could not deserialize plan {self.sha256[:12]}")
        self._context = self._engine.create_execution_context()
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        self._outputs = [
            n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT
        ]
        self._input_dtype = _torch_dtype(self._engine.get_tensor_dtype(INPUT_NAME))

    @property
    def device_memory_bytes(self) -> int:
        """Activation memory the execution context holds on the GPU (weights excluded)."""
        engine = self._engine
        size = getattr(engine, "device_memory_size_v2", None)
        return int(size if size is not None else engine.device_memory_size)

    @property
    def has_embedding(self) -> bool:
        """Whether the plan carries the ``embedding`` output (plans of old engines do not)."""
        return EMBEDDING_OUTPUT in self._outputs

    def run_raw(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        results = self._execute(batch)
        return (
            results[OCCUPANCY_OUTPUT].float().cpu().numpy(),
            results[LEAD_GAP_OUTPUT].float().cpu().numpy(),
        )

    def run_raw_with_embedding(
        self, batch: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``run_raw`` plus the embedding (None without one), from the same execution."""
        results = self._execute(batch)
        embedding = results.get(EMBEDDING_OUTPUT)
        return (
            results[OCCUPANCY_OUTPUT].float().cpu().numpy(),
            results[LEAD_GAP_OUTPUT].float().cpu().numpy(),
            None if embedding is None else embedding.float().cpu().numpy(),
        )

    def _execute(self, batch: np.ndarray) -> dict:
        import torch

        if len(batch) > self.max_batch:
            raise ValueError(f"batch {len(batch)} exceeds the plan's profile max {self.max_batch}")
        source = torch.from_numpy(np.ascontiguousarray(batch)).to(self.device)
        source = source.to(self._input_dtype).contiguous()
        context = self._context
        context.set_input_shape(INPUT_NAME, tuple(source.shape))
        context.set_tensor_address(INPUT_NAME, source.data_ptr())
        results = {}
        for name in self._outputs:
            shape = tuple(context.get_tensor_shape(name))
            dtype = _torch_dtype(self._engine.get_tensor_dtype(name))
            results[name] = torch.empty(shape, dtype=dtype, device=self.device)
            context.set_tensor_address(name, results[name].data_ptr())
        stream = torch.cuda.current_stream(self.device)
        if not context.execute_async_v3(stream.cuda_stream):
            raise TensorRTError(f"TensorRT execution failed for plan {self.sha256[:12]}")
        stream.synchronize()
        return results

    def infer(self, images: np.ndarray) -> Predictions:
        if len(images) == 0:
            empty = np.zeros((0, 3, self.spec.bins), dtype=np.float32)
            return Predictions(empty, np.zeros(0, np.float32), np.zeros(0, np.float32))
        occupancy, gaps = [], []
        for start in range(0, len(images), self.batch_size):
            logits, gap = self.run_raw(images_to_input(images[start : start + self.batch_size]))
            occupancy.append(logits)
            gaps.append(gap)
        return outputs_to_predictions(np.concatenate(occupancy), np.concatenate(gaps), self.spec)


def create(
    onnx_bytes: bytes,
    spec: PerceptionSpec,
    *,
    precision: str,
    name: str,
    batch_size: int = 64,
    cache_dir: Path | None = None,
    opt_batch: int = 32,
    max_batch: int = 64,
    workspace_mb: int = 1024,
    **_ignored,
) -> TensorRTEngine:
    """Build (or reuse the cached) plan for this GPU and load it."""
    platform = current_platform()
    onnx_sha256 = hashlib.sha256(onnx_bytes).hexdigest()
    cached: Path | None = None
    timing: Path | None = None
    if cache_dir is not None:
        cache_dir = Path(cache_dir)
        shapes = f"b{min(opt_batch, max_batch)}-{max_batch}"
        cached = (
            cache_dir
            / "plans"
            / (plan_cache_key(onnx_sha256, precision, platform, shapes) + PLAN_SUFFIX)
        )
        capability = platform.compute_capability.replace(".", "")
        timing = cache_dir / f"timing-sm{capability}-trt{platform.tensorrt_version}.cache"
    if cached is not None and cached.is_file():
        plan_file = cached.read_bytes()
    else:
        plan_file = build_plan(
            onnx_bytes,
            spec,
            precision=precision,
            opt_batch=opt_batch,
            max_batch=max_batch,
            workspace_mb=workspace_mb,
            timing_cache=timing,
        )
        if cached is not None:
            _atomic_write(cached, plan_file)
    return TensorRTEngine(plan_file, spec, name=name, batch_size=batch_size)
