"""Latency statistics, the memory probe and the latency gate."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from aiinfra_pipelines.deployment.backends import create_engine
from aiinfra_pipelines.deployment.benchmark import (
    LatencyStats,
    PeakMemory,
    latency_percentiles,
    measure_engine,
)
from aiinfra_pipelines.deployment.memory_probe import probe_peak_memory_mb
from aiinfra_pipelines.deployment.reports import latency_failures, ratios_to_fp32
from aiinfra_pipelines.deployment.settings import LatencyBudget
from aiinfra_pipelines.perception.contract import perception_spec


def test_percentiles_are_in_milliseconds_and_ordered():
    samples = np.arange(1, 101) / 1000.0  # 1..100 ms
    stats = latency_percentiles(samples)
    assert stats["p50_ms"] == pytest.approx(50.5)
    assert stats["p95_ms"] == pytest.approx(95.05)
    assert stats["p99_ms"] == pytest.approx(99.01)
    assert stats["mean_ms"] == pytest.approx(50.5)
    with pytest.raises(ValueError):
        latency_percentiles([])


def test_peak_memory_sees_fresh_pages_touched_inside_the_block():
    size = 40 * 2**20
    with PeakMemory() as probe:
        # An anonymous mapping is always new pages (a numpy array could reuse memory the
        # allocator kept from earlier tests, which rightly adds nothing to the peak).
        pages = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            pages[offset] = 1
    pages.close()
    assert probe.method == "vmhwm"
    assert 38.0 <= probe.mb < 60.0


def test_measuring_a_real_engine_gives_consistent_figures(exported, held_out):
    # A clock that ticks 2 ms per reading: every timed call "takes" 2 ms whatever the runner's
    # load, so the figures are exact (what the engine really costs is benchmarks' business).
    ticks = iter(range(10_000))
    probed = []

    def probe() -> tuple[float, str]:
        probed.append(True)
        return 42.5, "stub probe"

    stats = measure_engine(
        lambda: create_engine(exported.onnx_bytes, perception_spec(), intra_op_threads=1),
        held_out.images[:8],
        precision="fp32",
        iterations=30,
        warmup=3,
        serving_batch=16,
        throughput_iterations=3,
        memory_probe=probe,
        clock=lambda: next(ticks) * 0.002,
    )
    assert stats.iterations == 30 and stats.backend == "onnxruntime"
    # 30 batch-1 calls, two readings each, then two readings around 3 batched calls.
    assert next(ticks) == 2 * 30 + 2
    assert stats.p50_ms == stats.p95_ms == stats.p99_ms == pytest.approx(2.0)
    assert stats.throughput_fps == pytest.approx(16 * 3 / 0.002) and stats.serving_batch == 16
    assert probed == [True]
    assert (stats.peak_memory_mb, stats.memory_kind) == (42.5, "host_rss, stub probe")
    assert stats.engine_sha256 == exported.sha256


def test_an_engine_peak_is_measured_in_a_fresh_process(exported, held_out):
    peak, method = probe_peak_memory_mb(
        exported.onnx_bytes,
        held_out.images[:8],
        backend="onnxruntime",
        precision="fp32",
        serving_batch=16,
        intra_op_threads=1,
    )
    assert method == "vmhwm (fresh process)"
    # A session with its weights, arena and a batch of 16 inputs: more than nothing, far
    # less than a process.
    assert 0.5 < peak < 256


def _stats(precision: str, p99: float, fps: float, memory: float, p50: float = 1.0) -> LatencyStats:
    return LatencyStats(
        precision, "onnxruntime", "x", 10, p50, p99, p99, p50, 32, fps, memory, "host_rss"
    )


def test_the_latency_gate_names_every_breached_limit():
    budget = LatencyBudget(
        "cpu-ci", p99_ms_batch1=5.0, min_throughput_fps=100.0, max_peak_memory_mb=64
    )
    assert latency_failures(_stats("int8", 4.0, 150.0, 32.0), budget) == []
    failures = latency_failures(_stats("int8", 6.5, 80.0, 128.0), budget)
    assert len(failures) == 3
    assert "p99 latency 6.50 ms" in failures[0] and "cpu-ci" in failures[0]
    assert "throughput 80" in failures[1] and "peak memory 128" in failures[2]


def test_the_latency_gate_holds_the_network_to_the_cars_compute_budget():
    budget = LatencyBudget(
        "cpu-ci",
        p99_ms_batch1=5.0,
        min_throughput_fps=100.0,
        max_peak_memory_mb=64,
        max_macs_per_frame=20e6,
    )
    fast = _stats("int8", 4.0, 150.0, 32.0)
    assert latency_failures(fast, budget, macs_per_frame=17_161_728) == []
    (too_big,) = latency_failures(fast, budget, macs_per_frame=59_400_000)
    assert "59.4 M multiply-accumulates per frame > budget 20.0 M (cpu-ci)" in too_big
    (unknown,) = latency_failures(fast, budget, macs_per_frame=None)
    assert "unknown" in unknown
    # The project's profiles: the CPU target has a budget, targets not measured have none.
    assert LatencyBudget.load("cpu-ci").max_macs_per_frame == 2.0e9
    assert LatencyBudget.load("orin").max_macs_per_frame is None


def test_ratios_compare_every_engine_with_fp32():
    ratios = ratios_to_fp32(
        {"fp32": _stats("fp32", 2, 100, 1, p50=2.0), "int8": _stats("int8", 1, 250, 1, p50=1.0)}
    )
    assert ratios == {"int8_vs_fp32_p50": 0.5, "int8_vs_fp32_throughput": 2.5}
