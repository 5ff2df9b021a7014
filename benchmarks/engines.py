"""Engine figures: INT8 vs FP32 on onnxruntime CPU with the per-slice accuracy cost, and on a
GPU TensorRT FP16/INT8 vs PyTorch eager; prints figures, asserts nothing.

In one run, on real highway-env frames (a fleet is driven, a PerceptionNet trained for a few
epochs on its training logs, the held-out logs kept for accuracy):

1. the deployment pipeline's engines — FP32 export, FP16, and the mixed-precision INT8 chosen
   by the sensitivity-driven fallback loop (gates.yaml ``deployment.quantization``), plus the
   all-INT8 engine without fallback for comparison;
2. onnxruntime CPU latency (batch 1, p50/p95/p99) and throughput (serving batch) of each, in
   interleaved rounds (``--rounds``), with the INT8/FP32 ratios (median over rounds);
3. per-slice occupancy accuracy and lead-gap error of each engine on the held-out frames and
   the drop against FP32;
4. where ``tensorrt`` and a CUDA device exist: TensorRT FP32/FP16/INT8 plans (INT8 from a QDQ
   graph quantized for TensorRT: symmetric, float biases) vs PyTorch eager on the GPU.

    .venv/bin/python benchmarks/engines.py [--vehicles 4] [--episodes 2] [--epochs 6]
        [--iterations 300] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # aiinfra_pipelines_tests

import numpy as np
import pandas as pd

from aiinfra_pipelines.deployment.backends import BACKENDS, create_engine
from aiinfra_pipelines.deployment.benchmark import measure_engine
from aiinfra_pipelines.deployment.export import export_checked_onnx
from aiinfra_pipelines.deployment.fallback import mixed_precision_int8
from aiinfra_pipelines.deployment.memory_probe import probe_peak_memory_mb
from aiinfra_pipelines.deployment.parity import slice_metrics
from aiinfra_pipelines.deployment.quantize import convert_fp16, quantize_int8
from aiinfra_pipelines.deployment.settings import DeploymentSettings, deployment_gates
from aiinfra_pipelines.perception.contract import images_to_input, perception_spec
from aiinfra_pipelines_tests.support.fleet_data import fleet_frames
from aiinfra_pipelines_tests.support.trained_networks import (
    labelled,
    sample,
    split_logs,
    train_network,
)


def _cpu_latency(engines, images, args, serving_batch) -> pd.DataFrame:
    """Interleaved rounds over the engines; the median of each figure over rounds."""
    spec = perception_spec()
    rows: dict[str, list] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, onnx_bytes in engines.items():
            rows[name].append(
                measure_engine(
                    lambda b=onnx_bytes: create_engine(
                        b, spec, intra_op_threads=args.threads, batch_size=serving_batch
                    ),
                    images,
                    precision=name,
                    iterations=args.iterations,
                    warmup=20,
                    serving_batch=serving_batch,
                    throughput_iterations=20,
                    memory_probe=partial(
                        probe_peak_memory_mb,
                        onnx_bytes,
                        images,
                        backend="onnxruntime",
                        precision=name,
                        serving_batch=serving_batch,
                        intra_op_threads=args.threads,
                    ),
                )
            )
    table = []
    for name, stats in rows.items():
        table.append(
            {
                "engine": name,
                "p50_ms": statistics.median(s.p50_ms for s in stats),
                "p95_ms": statistics.median(s.p95_ms for s in stats),
                "p99_ms": statistics.median(s.p99_ms for s in stats),
                f"fps@{serving_batch}": statistics.median(s.throughput_fps for s in stats),
                "peak_mb": statistics.median(s.peak_memory_mb for s in stats),
            }
        )
    return pd.DataFrame(table).set_index("engine")


def _accuracy(engines, frames) -> pd.DataFrame:
    spec = perception_spec()
    reference = create_engine(engines["fp32"], spec).infer(frames.images)
    columns = {}
    for name, onnx_bytes in engines.items():
        table = slice_metrics(
            frames, create_engine(onnx_bytes, spec).infer(frames.images), reference, spec
        )
        table = table.set_index("slice")
        columns[(name, "acc")] = table["occupancy_accuracy"]
        columns[(name, "agree")] = table["occupancy_agreement"]
        columns[(name, "gap_mae_m")] = table["lead_gap_mae_m"]
        frames_column = table["frames"]
    result = pd.DataFrame(columns)
    result.insert(0, ("", "frames"), frames_column)
    for name in engines:
        if name != "fp32":
            result[(name, "acc_drop")] = result[("fp32", "acc")] - result[(name, "acc")]
    return result


def _eager_gpu(network, images, batch: int, iterations: int) -> tuple[float, float]:
    """PyTorch eager on CUDA: (p50 ms at batch 1, frames/s at ``batch``)."""
    import torch

    model = network.eval().cuda()
    one = torch.from_numpy(images_to_input(images[:1])).cuda()
    many = torch.from_numpy(images_to_input(np.resize(images, (batch, *images.shape[1:])))).cuda()
    with torch.inference_mode():
        for _ in range(20):
            model(one)
        torch.cuda.synchronize()
        samples = []
        for _ in range(iterations):
            start = time.perf_counter()
            model(one)
            torch.cuda.synchronize()
            samples.append(time.perf_counter() - start)
        model(many)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            model(many)
        torch.cuda.synchronize()
        fps = 20 * batch / (time.perf_counter() - start)
    return float(np.median(samples) * 1e3), fps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vehicles", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    settings, gates, spec = DeploymentSettings.load(), deployment_gates(), perception_spec()

    started = time.perf_counter()
    frames = fleet_frames(args.vehicles, args.episodes, 0)
    train, held = split_logs(frames)
    print(
        f"fleet: {len(frames)} frames, {frames['slice'].nunique()} slices "
        f"({time.perf_counter() - started:.0f} s); train {len(train)}, held out {len(held)}"
    )
    started = time.perf_counter()
    network = train_network(labelled(train), epochs=args.epochs)
    calibration = labelled(sample(train, 256))
    held_out = labelled(held)
    exported = export_checked_onnx(
        network, calibration.head(32).inputs(), tolerance=1e-4, opset=settings.opset
    )
    mixed = mixed_precision_int8(
        exported.onnx_bytes, calibration, settings.quantization, gates["quantization"], spec
    )
    engines = {
        "fp32": exported.onnx_bytes,
        "fp16": convert_fp16(exported.onnx_bytes),
        "int8": mixed.int8_onnx,
        "int8-all": quantize_int8(exported.onnx_bytes, calibration.inputs(), settings.quantization),
    }
    elapsed = time.perf_counter() - started
    print(
        f"trained {args.epochs} epochs, exported, quantized in {elapsed:.0f} s;"
        f" INT8 plan keeps {mixed.plan.fp32_nodes or 'no node'} in FP32 after "
        f"{len(mixed.plan.steps) - 1} fallback step(s)"
    )

    serving = settings.benchmark.serving_batch
    latency = _cpu_latency(engines, held_out.images[:64], args, serving)
    print(f"\nonnxruntime CPU, {args.threads} intra-op thread(s), median of {args.rounds} rounds:")
    print(latency.round(3).to_string())
    fp32 = latency.loc["fp32"]
    for name in ("int8", "int8-all", "fp16"):
        row = latency.loc[name]
        print(
            f"{name}/fp32: p50 latency x{row['p50_ms'] / fp32['p50_ms']:.2f}, "
            f"p99 x{row['p99_ms'] / fp32['p99_ms']:.2f}, "
            f"throughput x{row[f'fps@{serving}'] / fp32[f'fps@{serving}']:.2f}"
        )

    accuracy = _accuracy(engines, held_out)
    print(f"\nper-slice accuracy on {len(held_out)} held-out frames (drop = FP32 - engine):")
    with pd.option_context("display.width", 200, "display.max_columns", 40):
        print(accuracy.round(4).to_string())

    available, reason = BACKENDS["tensorrt"].is_available()
    if not available:
        print(f"\nTensorRT: skipped ({reason})")
        return
    for_tensorrt = settings.quantization.for_target(settings.targets["gpu-ci"])
    gpu_mixed = mixed_precision_int8(
        exported.onnx_bytes, calibration, for_tensorrt, gates["quantization"], spec
    )
    gpu_engines = {
        "fp32": exported.onnx_bytes,
        "fp16": engines["fp16"],
        "int8": gpu_mixed.int8_onnx,
    }
    cache = Path(settings.tensorrt.cache_dir)
    print(f"\nTensorRT ({reason}); INT8 keeps {gpu_mixed.plan.fp32_nodes or 'no node'} in FP32")
    eager_ms, eager_fps = _eager_gpu(network, held_out.images, serving, args.iterations)
    rows = [{"engine": "pytorch-eager", "p50_ms": eager_ms, f"fps@{serving}": eager_fps}]
    for name, onnx_bytes in gpu_engines.items():
        stats = measure_engine(
            lambda b=onnx_bytes, p=name: create_engine(
                b,
                spec,
                backend="tensorrt",
                precision=p,
                cache_dir=cache,
                opt_batch=serving,
                max_batch=settings.tensorrt.max_batch,
                batch_size=serving,
            ),
            held_out.images[:64],
            precision=name,
            iterations=args.iterations,
            warmup=20,
            serving_batch=serving,
            throughput_iterations=20,
        )
        rows.append(
            {
                "engine": f"tensorrt-{name}",
                "p50_ms": stats.p50_ms,
                "p99_ms": stats.p99_ms,
                f"fps@{serving}": stats.throughput_fps,
                "device_mb": stats.peak_memory_mb,
            }
        )
    gpu = pd.DataFrame(rows).set_index("engine")
    print(gpu.round(3).to_string())
    for name in ("fp16", "int8"):
        row = gpu.loc[f"tensorrt-{name}"]
        print(
            f"tensorrt-{name} vs pytorch eager: p50 x{row['p50_ms'] / eager_ms:.2f}, "
            f"throughput x{row[f'fps@{serving}'] / eager_fps:.2f}"
        )
    gpu_accuracy = _accuracy(
        {name: b for name, b in gpu_engines.items()}, held_out
    )  # onnxruntime view of the TensorRT-flavoured graphs
    print("\nper-slice accuracy of the TensorRT-flavoured graphs (onnxruntime):")
    print(gpu_accuracy.round(4).to_string())


if __name__ == "__main__":
    main()
