"""Engine backends behind one interface (``perception.engine.Engine``), chosen by name.

``create_engine(onnx_bytes, spec, backend=..., precision=...)`` returns something with ``name``,
``sha256`` and ``infer(images) -> Predictions`` whichever runtime is underneath; ``"auto"``
takes the first available backend in :data:`PREFERENCE`. A backend that cannot run here (no
``tensorrt`` module, no CUDA device) is refused with the reason, never silently replaced: a
latency measured on the wrong runtime would gate the wrong engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.perception.contract import PerceptionSpec
from aiinfra_pipelines.perception.engine import Engine

from . import onnxruntime as _onnxruntime
from . import tensorrt as _tensorrt

AUTO = "auto"


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine (``reason`` says why)."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"engine backend {backend!r} is not available here: {reason}")
        self.backend = backend
        self.reason = reason


@dataclass(frozen=True)
class EngineBackend:
    name: str
    is_available: Callable[[], tuple[bool, str]]
    create: Callable[..., Engine]


BACKENDS: dict[str, EngineBackend] = {
    _onnxruntime.NAME: EngineBackend(
        _onnxruntime.NAME, _onnxruntime.is_available, _onnxruntime.create
    ),
    _tensorrt.NAME: EngineBackend(_tensorrt.NAME, _tensorrt.is_available, _tensorrt.create),
}
# "auto" prefers the accelerator when there is one.
PREFERENCE: tuple[str, ...] = (_tensorrt.NAME, _onnxruntime.NAME)


def register_backend(backend: EngineBackend) -> None:
    """Add (or replace) a backend — e.g. another accelerator's runtime in a plugin package."""
    BACKENDS[backend.name] = backend


def backend_status() -> dict[str, str]:
    """``{backend: "available: ..." | "unavailable: <reason>"}`` for reports and the CLI."""
    status = {}
    for name, backend in BACKENDS.items():
        available, reason = backend.is_available()
        status[name] = ("available: " if available else "unavailable: ") + reason
    return status


def available_backends() -> list[str]:
    return [name for name, backend in BACKENDS.items() if backend.is_available()[0]]


def resolve_backend(name: str) -> str:
    """``name`` itself when it can run here (``"auto"``: the preferred available one)."""
    if name == AUTO:
        for candidate in PREFERENCE:
            if candidate in BACKENDS and BACKENDS[candidate].is_available()[0]:
                return candidate
        raise BackendUnavailableError(AUTO, "no engine backend can run here")
    if name not in BACKENDS:
        raise ValueError(f"unknown engine backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
    available, reason = BACKENDS[name].is_available()
    if not available:
        raise BackendUnavailableError(name, reason)
    return name


def create_engine(
    onnx_bytes: bytes,
    spec: PerceptionSpec,
    *,
    backend: str = _onnxruntime.NAME,
    precision: str = "fp32",
    name: str | None = None,
    **options: Any,
) -> Engine:
    """An engine for ``onnx_bytes`` (already in ``precision``) on ``backend``.

    ``options`` go to the backend (``batch_size``, ``intra_op_threads`` for onnxruntime;
    ``cache_dir``, ``opt_batch``, ``max_batch``, ``workspace_mb`` for TensorRT); a backend
    ignores the ones it does not know.
    """
    resolved = resolve_backend(backend)
    return BACKENDS[resolved].create(
        onnx_bytes, spec, precision=precision, name=name or f"{resolved}-{precision}", **options
    )
