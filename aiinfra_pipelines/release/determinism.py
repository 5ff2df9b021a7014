"""Certification's determinism check: the same engine on the same frames, bit for bit.

A car's engine must answer a frame the same way every time: a replayed log must reproduce the
decision the car made, shadow mode and simulation compare engines frame by frame, and a badcase
mined from a log is only a badcase if the engine sees it again. Nondeterminism comes from the
runtime, not the graph: reductions whose order depends on the thread count, independent
branches run in parallel, GPU atomics and autotuned kernels. So certification runs the shipped
engine ``runs`` times, each in a *fresh* engine (new session: nothing warmed up or cached
carries over) with fixed intra-op threads and sequential execution, on the same seeded frames
at batch 1, and requires bit-identical outputs — the runtime's raw tensors where the engine
exposes them (a one-ulp difference can vanish in post-processing) and the predictions the
planner reads. An engine whose outputs differ in a single bit is refused with the runs and the
largest difference named. Numbers come from gates.yaml ``release.determinism``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.deployment.backends import BackendUnavailableError, create_engine
from aiinfra_pipelines.deployment.settings import DeploymentSettings
from aiinfra_pipelines.perception.contract import PerceptionSpec, images_to_input
from aiinfra_pipelines.perception.engine import Engine

GATE = "determinism"
GATES_FILE = "gates.yaml"


@dataclass(frozen=True)
class DeterminismSettings:
    """gates.yaml ``release.determinism``; ``backend`` ``None``: the engine target's backend."""

    runs: int
    frames: int
    seed: int
    intra_op_threads: int
    backend: str | None = None

    @classmethod
    def load(cls, gates: Mapping[str, Any] | None = None) -> DeterminismSettings:
        source = gates if gates is not None else load_resource_yaml(GATES_FILE)
        section = (source.get("release") or {}).get(GATE)
        if not isinstance(section, Mapping):
            raise KeyError(f"{GATES_FILE} has no release.{GATE} section")
        backend = section.get("backend")
        settings = cls(
            runs=int(section["runs"]),
            frames=int(section["frames"]),
            seed=int(section["seed"]),
            intra_op_threads=int(section["intra_op_threads"]),
            backend=None if backend is None else str(backend),
        )
        if settings.runs < 2:
            raise ValueError(f"{GATES_FILE} release.{GATE}.runs must be >= 2 (it compares runs)")
        if settings.frames < 1:
            raise ValueError(f"{GATES_FILE} release.{GATE}.frames must be >= 1")
        if settings.intra_op_threads < 1:
            raise ValueError(
                f"{GATES_FILE} release.{GATE}.intra_op_threads must be >= 1 (0 lets the "
                "runtime choose, which is not a fixed thread count)"
            )
        return settings


@dataclass(frozen=True)
class DeterminismResult:
    """What the check ran and found; ``reason`` says why an engine is refused ("" if not)."""

    deterministic: bool
    backend: str
    runs: int
    frames: int
    intra_op_threads: int
    output_sha256: tuple[str, ...]  # one per run: equal when deterministic
    max_abs_difference: float | None  # None: not comparable (shapes differ, or not run)
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["output_sha256"] = list(self.output_sha256)
        return record


EngineFactory = Callable[[], Engine]


def check_frames(spec: PerceptionSpec, count: int, seed: int) -> np.ndarray:
    """``count`` seeded uint8 camera frames of the engine's input size.

    Determinism is a property of the runtime and the graph, which run the same kernels on any
    pixels; seeded noise needs nothing from the lake, so every certification sees the same.
    """
    rng = np.random.default_rng(seed)
    shape = (count, spec.image_height, spec.image_width, 3)
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def engine_outputs(engine: Engine, frames: np.ndarray) -> list[np.ndarray]:
    """Every output of ``engine`` on ``frames``, one frame at a time: raw tensors when the
    engine exposes ``run_raw``, then the occupancy, lead gap and confidence it reports."""
    outputs: list[np.ndarray] = []
    run_raw = getattr(engine, "run_raw", None)
    for index in range(len(frames)):
        frame = frames[index : index + 1]
        if run_raw is not None:
            outputs.extend(np.asarray(tensor) for tensor in run_raw(images_to_input(frame)))
        predictions = engine.infer(frame)
        outputs += [predictions.occupancy, predictions.lead_gap_m, predictions.confidence]
    return outputs


def outputs_sha256(outputs: list[np.ndarray]) -> str:
    """SHA-256 over every output's dtype, shape and bytes: equal iff bit-identical."""
    digest = hashlib.sha256()
    for array in outputs:
        contiguous = np.ascontiguousarray(array)
        digest.update(f"{contiguous.dtype.str}{contiguous.shape}".encode())
        digest.update(contiguous.tobytes())
    return digest.hexdigest()


def _max_difference(first: list[np.ndarray], other: list[np.ndarray]) -> float | None:
    if len(first) != len(other):
        return None
    if any(a.shape != b.shape for a, b in zip(first, other, strict=True)):
        return None
    differences = [
        float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
        for a, b in zip(first, other, strict=True)
    ]
    return max(differences, default=0.0)


def check_determinism(
    make_engine: EngineFactory,
    frames: np.ndarray,
    runs: int,
    *,
    backend: str = "",
    intra_op_threads: int = 0,
) -> DeterminismResult:
    """Run a fresh engine from ``make_engine`` ``runs`` times on ``frames``; compare bits."""
    results = [engine_outputs(make_engine(), frames) for _ in range(runs)]
    digests = tuple(outputs_sha256(outputs) for outputs in results)
    differing = [run for run, digest in enumerate(digests) if digest != digests[0]]
    differences = [_max_difference(results[0], results[run]) for run in differing]
    largest = (
        None if None in differences else max((d for d in differences if d is not None), default=0.0)
    )
    reason = ""
    if differing:
        size = (
            "outputs of another shape" if largest is None else f"largest difference {largest:.3g}"
        )
        reason = (
            f"not deterministic: run(s) {differing} of {runs} gave outputs different from run 0 "
            f"on the same {len(frames)} frame(s) ({size}) with {intra_op_threads} intra-op "
            "thread(s), sequential execution, fresh sessions"
        )
    return DeterminismResult(
        deterministic=not differing,
        backend=backend,
        runs=runs,
        frames=len(frames),
        intra_op_threads=intra_op_threads,
        output_sha256=digests,
        max_abs_difference=largest,
        reason=reason,
    )


def backend_for_target(runtime_target: str) -> str:
    """The engine backend of the deployment target whose ``runtime_target`` shipped it."""
    for target in DeploymentSettings.load().targets.values():
        if target.runtime_target == runtime_target:
            return target.backend
    raise KeyError(f"no deployment target has runtime_target {runtime_target!r}")


def check_engine(
    engine_bytes: bytes,
    spec: PerceptionSpec,
    *,
    runtime_target: str,
    settings: DeterminismSettings | None = None,
) -> DeterminismResult:
    """The determinism check of a shipped engine file, on its target's backend (or the one
    ``settings`` names). An engine the check cannot run is not deterministic either: its
    ``reason`` says why it could not be checked."""
    settings = settings or DeterminismSettings.load()
    try:
        backend = settings.backend or backend_for_target(runtime_target)
    except KeyError as error:
        return _unchecked("", settings, f"cannot check determinism: {error.args[0]}")

    def make_engine() -> Engine:
        return create_engine(
            engine_bytes,
            spec,
            backend=backend,
            name=f"determinism-{backend}",
            batch_size=1,
            intra_op_threads=settings.intra_op_threads,
        )

    frames = check_frames(spec, settings.frames, settings.seed)
    try:
        return check_determinism(
            make_engine,
            frames,
            settings.runs,
            backend=backend,
            intra_op_threads=settings.intra_op_threads,
        )
    except BackendUnavailableError as error:
        return _unchecked(backend, settings, f"cannot check determinism here: {error}")


def _unchecked(backend: str, settings: DeterminismSettings, reason: str) -> DeterminismResult:
    return DeterminismResult(
        deterministic=False,
        backend=backend,
        runs=0,
        frames=settings.frames,
        intra_op_threads=settings.intra_op_threads,
        output_sha256=(),
        max_abs_difference=None,
        reason=reason,
    )
