"""Latency, throughput and memory of an engine, measured the way the car would feel them.

- Latency: ``infer`` on one real frame at a time (pre- and post-processing included, as the
  car calls it), after warm-up runs; p50/p95/p99 over the timed runs. Tail latency is what
  the budget gates: a p99 over budget means a frame in a hundred arrives late.
- Throughput: frames per second of ``infer`` on the serving batch.
- Peak memory: what creating and running the engine adds to a process, from the kernel's
  resident-set high-water mark (reset through ``/proc/self/clear_refs``); measured in a fresh
  process (``memory_probe``) where one is given, since a long-lived process recycles memory.
  Engines that live on a GPU report their device memory instead (``device_memory_bytes``).
"""

from __future__ import annotations

import re
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from aiinfra_pipelines.perception.engine import Engine

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass(frozen=True)
class LatencyStats:
    precision: str
    backend: str
    engine_sha256: str
    iterations: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    serving_batch: int
    throughput_fps: float
    peak_memory_mb: float
    memory_kind: str  # "host_rss, ..." or "device": what peak_memory_mb measures, and how

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def latency_percentiles(samples_s: list[float] | np.ndarray) -> dict[str, float]:
    """p50/p95/p99/mean in milliseconds of per-call durations in seconds."""
    values = np.asarray(samples_s, dtype=np.float64) * 1e3
    if values.size == 0:
        raise ValueError("no latency samples")
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {
        "p50_ms": float(p50),
        "p95_ms": float(p95),
        "p99_ms": float(p99),
        "mean_ms": float(values.mean()),
    }


def _status_kib(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


class PeakMemory:
    """Peak resident memory added inside the block, in MiB (Linux high-water mark).

    Falls back to the process-lifetime peak (``ru_maxrss``, an over-estimate) where the
    high-water mark cannot be reset; ``method`` says which was used.
    """

    def __enter__(self) -> PeakMemory:
        self.method = "vmhwm"
        try:
            _CLEAR_REFS.write_text("5")  # reset VmHWM to the current RSS
        except OSError:
            self.method = "ru_maxrss"
        self._baseline = _status_kib("VmRSS")
        if self._baseline is None:
            self.method = "ru_maxrss"
        self.mb = 0.0
        return self

    def __exit__(self, *exc_info) -> None:
        if self.method == "vmhwm":
            peak = _status_kib("VmHWM") or 0
            self.mb = max(0.0, (peak - (self._baseline or 0)) / 1024.0)
        else:
            self.mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_engine(
    make_engine: Callable[[], Engine],
    images: np.ndarray,
    *,
    precision: str,
    iterations: int,
    warmup: int,
    serving_batch: int,
    throughput_iterations: int,
    memory_probe: Callable[[], tuple[float, str]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> LatencyStats:
    """Create the engine with ``make_engine`` and measure it on ``images`` (real frames, cycled).

    Peak memory: the engine's ``device_memory_bytes`` where it has one (GPU engines), else
    ``memory_probe()`` (``memory_probe.probe_peak_memory_mb`` measures in a fresh process),
    else the resident-set peak of this process around creating and running the engine.
    """
    if len(images) == 0:
        raise ValueError("benchmark needs at least one frame")
    with PeakMemory() as memory:
        engine = make_engine()
        for i in range(warmup):
            engine.infer(images[i % len(images)][None])
        samples = []
        for i in range(iterations):
            frame = images[i % len(images)][None]
            start = clock()
            engine.infer(frame)
            samples.append(clock() - start)
        reps = int(np.ceil(serving_batch / len(images)))
        batch = np.concatenate([images] * reps)[:serving_batch]
        engine.infer(batch)  # warm the batched path
        start = clock()
        for _ in range(throughput_iterations):
            engine.infer(batch)
        elapsed = clock() - start
    device_bytes = getattr(engine, "device_memory_bytes", None)
    if device_bytes is not None:
        peak_mb, memory_kind = float(device_bytes) / 2**20, "device"
    elif memory_probe is not None:
        peak_mb, method = memory_probe()
        memory_kind = f"host_rss, {method}"
    else:
        peak_mb, memory_kind = memory.mb, f"host_rss, {memory.method} (this process)"
    return LatencyStats(
        precision=precision,
        backend=str(getattr(engine, "backend", "")),
        engine_sha256=engine.sha256,
        iterations=iterations,
        **latency_percentiles(samples),
        serving_batch=serving_batch,
        throughput_fps=float(serving_batch * throughput_iterations / elapsed)
        if elapsed > 0
        else 0.0,
        peak_memory_mb=peak_mb,
        memory_kind=memory_kind,
    )
