"""Engine figures: INT8 vs FP32 on onnxruntime CPU with the per-slice accuracy cost, and on a
GPU TensorRT FP16/INT8 vs PyTorch eager; reports figures, asserts nothing.

In one run, on real highway-env frames (a fleet is driven, the loop's PerceptionNet —
``training.yaml`` ``model``, ``--width``/``--hidden`` to size another — trained for a few
epochs on its training logs, the held-out logs kept for accuracy):

1. the deployment pipeline's engines — FP32 export, FP16, and the mixed-precision INT8 chosen
   by the sensitivity-driven fallback loop (gates.yaml ``deployment.quantization``; the engine
   the loop certifies and ships), plus the all-INT8 engine without fallback for comparison;
2. onnxruntime CPU latency (batch 1, p50/p95/p99) and throughput (serving batch) of each, in
   interleaved rounds (``--rounds``), with the INT8/FP32 ratios (median over rounds);
3. per-slice occupancy accuracy and lead-gap error of each engine on the held-out frames and
   the drop against FP32; the shipped INT8 engine judged by gates.yaml ``deployment.parity``;
4. with ``--profile``: onnxruntime's per-operator profile of the FP32 and INT8 engines at
   batch 1 and at the serving batch (where the time goes, the Conv/Gemm share; which QDQ
   groups the optimizer fused into QLinear* kernels);
5. where ``tensorrt`` and a CUDA device exist: TensorRT FP32/FP16/INT8 plans (INT8 from a QDQ
   graph quantized for TensorRT: symmetric, float biases) vs PyTorch eager on the GPU.

Issue 13's target on CPU is INT8 >= 1.5x FP32 throughput with every slice within budget: this
script *reports* ``int8_speedup`` and ``worst_slice_drop`` against it, it does not assert it
(timings move with the machine's load, reported as ``load_average``).

    .venv/bin/python benchmarks/engines.py [--vehicles 4] [--episodes 2] [--epochs 6]
        [--iterations 300] [--rounds 3] [--threads 1] [--width N] [--hidden N]
        [--quantization JSON] [--profile] [--json]

``--json`` prints one JSON object on stdout (everything else goes to stderr) with at least
``fp32_fps``, ``int8_fps``, ``int8_speedup``, ``fp32_p99_ms``, ``int8_p99_ms`` and
``worst_slice_drop``. The INT8 engines are quantized as the loop quantizes for the onnxruntime
CPU target (deployment.yaml ``quantization`` with ``targets.cpu-ci.quantization`` on top: U8S8,
pre-processed graph, camera input); ``--quantization '{"per_channel": false}'`` overrides those
fields for this run only, to try a recipe without changing the loop's. ``--quantization
'{"camera_input": false}'`` measures the INT8 engine fed normalized floats;
``'{"activation_type": "QInt8", "preprocess": false, "camera_input": false}'`` the recipe before
that: most Conv/Gemm then stay float between Q/DQ pairs (``--profile``'s ``graph_ops`` shows
which). With camera input the report also times ``fp32-camera``, an FP32 graph that takes the
camera's bytes too (normalized inside the graph), and prints ``int8_speedup_vs_fp32_camera``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # aiinfra_pipelines_tests

import numpy as np
import pandas as pd
import torch

from aiinfra_pipelines.deployment.backends import BACKENDS, create_engine
from aiinfra_pipelines.deployment.benchmark import measure_engine
from aiinfra_pipelines.deployment.camera_input import with_camera_input
from aiinfra_pipelines.deployment.export import export_checked_onnx
from aiinfra_pipelines.deployment.fallback import QuantizationBudgetError, mixed_precision_int8
from aiinfra_pipelines.deployment.memory_probe import probe_peak_memory_mb
from aiinfra_pipelines.deployment.model_cost import count_macs
from aiinfra_pipelines.deployment.parity import compare_with_fp32, slice_metrics
from aiinfra_pipelines.deployment.quantize import convert_fp16, quantize_int8
from aiinfra_pipelines.deployment.settings import DeploymentSettings, deployment_gates
from aiinfra_pipelines.evaluation.slices import OVERALL
from aiinfra_pipelines.perception.contract import (
    INPUT_NAME,
    images_to_input,
    perception_spec,
    session_takes_camera_bytes,
)
from aiinfra_pipelines.perception.network import PerceptionNet
from aiinfra_pipelines.training.module import PerceptionModule
from aiinfra_pipelines.training.settings import load_training_config
from aiinfra_pipelines_tests.support.fleet_data import fleet_frames
from aiinfra_pipelines_tests.support.trained_networks import (
    fit_network,
    labelled,
    sample,
    split_logs,
)

# The target whose quantizer settings the CPU figures use (deployment.yaml targets).
CPU_TARGET = "cpu-ci"


def _say(*parts: Any) -> None:
    """Progress and human-readable tables: stdout (redirected to stderr under ``--json``)."""
    print(*parts, file=sys.stdout, flush=True)


def _load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def _build_network(args: argparse.Namespace) -> tuple[PerceptionNet, dict[str, Any]]:
    """The loop's architecture (``training.yaml`` ``model``) with ``--width``/``--hidden``."""
    model: dict[str, Any] = {}
    if args.width is not None:
        model["width"] = args.width
    if args.hidden is not None:
        model["hidden"] = args.hidden
    config = load_training_config({"model": model} if model else None)
    torch.manual_seed(args.seed)
    network = PerceptionModule.from_config(perception_spec(), config, args.seed).net
    return network, config


def _train(network: PerceptionNet, frames, config: dict[str, Any], epochs: int, seed: int) -> None:
    """Plain AdamW with the project's loss and ``training.yaml`` optimizer (no augmentation):
    enough for a network whose quantization questions mean something, in minutes on a CPU."""
    fit_network(
        network,
        frames,
        epochs,
        seed,
        lr=float(config["optimizer"]["lr"]),
        weight_decay=float(config["optimizer"]["weight_decay"]),
        lead_gap_weight=float(config["loss"]["lead_gap_weight"]),
        smooth_l1_beta=float(config["loss"]["smooth_l1_beta"]),
    )


def _quantization_settings(settings: DeploymentSettings, overrides: str | None):
    """The loop's quantizer settings for the onnxruntime CPU target, with ``--quantization``
    JSON fields replaced."""
    cpu = settings.quantization.for_target(settings.targets[CPU_TARGET])
    if not overrides:
        return cpu
    try:
        changes = json.loads(overrides)
    except json.JSONDecodeError as error:
        raise SystemExit(f"--quantization is not JSON ({error}): {overrides!r}") from None
    if not isinstance(changes, dict):
        raise SystemExit(f"--quantization must be a JSON object, got {overrides!r}")
    known = {f.name for f in dataclasses.fields(cpu)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise SystemExit(f"--quantization: unknown field(s) {unknown}; known: {sorted(known)}")
    return dataclasses.replace(cpu, **changes)


def _fp32_with_camera_input(fp32_onnx: bytes) -> bytes:
    """The FP32 graph taking uint8 N x H x W x 3 frames, transposed and scaled by 1/255 inside
    the graph: what an FP32 engine with camera input would cost (not shipped by the loop)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load_from_string(fp32_onnx)
    graph = model.graph
    old = graph.input[0]
    batch, channels, height, width = (
        dim.dim_param or dim.dim_value for dim in old.type.tensor_type.shape.dim
    )
    normalized = f"{INPUT_NAME}_normalized"
    for node in graph.node:
        node.input[:] = [normalized if name == INPUT_NAME else name for name in node.input]
    graph.initializer.append(numpy_helper.from_array(np.array(1 / 255, np.float32), "inv255"))
    nodes = [
        helper.make_node("Transpose", [INPUT_NAME], ["camera_nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Cast", ["camera_nchw"], ["camera_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["camera_float", "inv255"], [normalized]),
    ]
    for position, node in enumerate(nodes):
        graph.node.insert(position, node)
    graph.input.remove(old)
    graph.input.insert(
        0,
        helper.make_tensor_value_info(
            INPUT_NAME, TensorProto.UINT8, [batch, height, width, channels]
        ),
    )
    onnx.checker.check_model(model)
    return model.SerializeToString()


def shipped_int8(
    fp32_onnx, calibration, quantization, gates, spec, settings: DeploymentSettings
) -> tuple[bytes, dict]:
    """The INT8 engine the loop would ship for ``quantization``'s target: the fallback's mixed
    precision, rewritten for camera input when the target takes it. If the fallback cannot
    hold the quantization budget, the engine of its last plan, marked uncertified (the loop
    would try QAT, then ship FP16 or FP32)."""
    error_text = ""
    try:
        mixed = mixed_precision_int8(
            fp32_onnx, calibration, quantization, gates["quantization"], spec
        )
        plan, onnx_bytes = mixed.plan, mixed.int8_onnx
    except QuantizationBudgetError as error:
        plan, error_text = error.plan, str(error)
        onnx_bytes = quantize_int8(
            fp32_onnx, calibration.inputs(), quantization, exclude=plan.fp32_nodes
        )
        _say(f"fallback failed the quantization budget: {error}")
    info: dict[str, Any] = {
        "int8_fp32_nodes": list(plan.fp32_nodes),
        "int8_fallback_steps": len(plan.steps) - 1,
        "int8_quantization_passed": not error_text,
        "int8_quantization_error": error_text,
    }
    if quantization.camera_input:  # as quantized_engine does for the target
        camera = with_camera_input(onnx_bytes, calibration.spread(settings.parity_frames).images)
        onnx_bytes, info["int8_camera_input"] = camera.onnx_bytes, camera.to_dict()
    return onnx_bytes, info


def _cpu_latency(engines, images, args, serving_batch) -> pd.DataFrame:
    """Interleaved rounds over the engines; the median of each figure over rounds, and the
    median over rounds of each engine's throughput ratio to FP32 in the same round."""
    spec = perception_spec()
    rows: dict[str, list] = {name: [] for name in engines}
    for round_index in range(args.rounds):
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
        _say(f"round {round_index + 1}/{args.rounds} done, load average {_load_average()}")
    table = []
    for name, stats in rows.items():
        table.append(
            {
                "engine": name,
                "p50_ms": statistics.median(s.p50_ms for s in stats),
                "p95_ms": statistics.median(s.p95_ms for s in stats),
                "p99_ms": statistics.median(s.p99_ms for s in stats),
                f"fps@{serving_batch}": statistics.median(s.throughput_fps for s in stats),
                "fps_vs_fp32": statistics.median(
                    s.throughput_fps / f.throughput_fps
                    for s, f in zip(stats, rows["fp32"], strict=True)
                ),
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


def _slice_verdict(engines, frames, parity: dict[str, Any]) -> dict[str, Any]:
    """The shipped INT8 engine vs FP32 on the held-out frames under gates.yaml
    ``deployment.parity``: worst occupancy-accuracy drop over slices with enough frames."""
    spec = perception_spec()
    reference = create_engine(engines["fp32"], spec).infer(frames.images)
    fp32_table = slice_metrics(frames, reference, reference, spec)
    int8_table = slice_metrics(
        frames, create_engine(engines["int8"], spec).infer(frames.images), reference, spec
    )
    comparison = compare_with_fp32("int8", int8_table, fp32_table, parity)
    fp32_accuracy = fp32_table.set_index("slice")["occupancy_accuracy"]
    int8_accuracy = int8_table.set_index("slice")["occupancy_accuracy"]
    enough = fp32_table.set_index("slice")["frames"] >= int(parity.get("min_slice_frames", 0))
    drops = (fp32_accuracy - int8_accuracy)[enough]
    return {
        "fp32_accuracy": float(fp32_accuracy[OVERALL]),
        "int8_accuracy": float(int8_accuracy[OVERALL]),
        "worst_slice_drop": float(drops.max()),
        "worst_slice": str(drops.idxmax()),
        "slices_compared": int(enough.sum()),
        "min_slice_frames": int(parity.get("min_slice_frames", 0)),
        "int8_within_parity_budget": bool(comparison.passed),
        "int8_parity_failures": list(comparison.failures),
    }


# The kernels quantization speeds up (float and integer forms as onnxruntime names them); all
# else (slices, reductions, the grid head's arithmetic, layout transposes) runs in float.
WEIGHTED_KERNELS = frozenset(
    {"Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul", "QLinearConv", "QGemm", "QLinearMatMul"}
)


def _profile(
    onnx_bytes: bytes, images: np.ndarray, threads: int, runs: int, batch: int = 1
) -> dict[str, Any]:
    """onnxruntime's profile at ``batch``: kernel time per operator type and per node (share of
    the total), the share spent in Conv/Gemm kernels, and the operator types of the optimized
    graph the session really runs."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="aiinfra-profile-") as directory:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(directory) / "profile")
        options.optimized_model_filepath = str(Path(directory) / "optimized.onnx")
        session = ort.InferenceSession(
            onnx_bytes, sess_options=options, providers=["CPUExecutionProvider"]
        )
        name = session.get_inputs()[0].name
        frames = np.resize(images, (batch, *images.shape[1:]))
        inputs = frames if session_takes_camera_bytes(session) else images_to_input(frames)
        for _ in range(runs):
            session.run(None, {name: inputs})
        events = json.loads(Path(session.end_profiling()).read_text())
        graph_ops = Counter(
            n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node
        )
    by_op: Counter = Counter()
    by_node: Counter = Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op_type = event.get("args", {}).get("op_name", "?")
            by_op[op_type] += event["dur"]
            by_node[f"{event['name'].removesuffix('_kernel_time')} ({op_type})"] += event["dur"]
    total = sum(by_op.values()) or 1
    weighted = sum(t for op, t in by_op.items() if op in WEIGHTED_KERNELS)
    return {
        "batch": batch,
        "us_per_frame": round(total / runs / batch, 1),
        "conv_gemm_share": round(weighted / total, 3),
        "top_ops": {op: round(t / total, 3) for op, t in by_op.most_common(8)},
        "top_nodes": {node: round(t / total, 3) for node, t in by_node.most_common(8)},
        "graph_ops": dict(graph_ops.most_common()),
    }


def _eager_gpu(network, images, batch: int, iterations: int) -> tuple[float, float]:
    """PyTorch eager on CUDA: (p50 ms at batch 1, frames/s at ``batch``)."""
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


def _tensorrt(network, exported, engines, calibration, held_out, args, report) -> None:
    """TensorRT FP32/FP16/INT8 vs PyTorch eager, where a CUDA device and TensorRT exist."""
    available, reason = BACKENDS["tensorrt"].is_available()
    if not available:
        _say(f"\nTensorRT: skipped ({reason})")
        report["tensorrt"] = {"skipped": reason}
        return
    settings, gates, spec = DeploymentSettings.load(), deployment_gates(), perception_spec()
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
    serving = settings.benchmark.serving_batch
    _say(f"\nTensorRT ({reason}); INT8 keeps {gpu_mixed.plan.fp32_nodes or 'no node'} in FP32")
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
    _say(gpu.round(3).to_string())
    report["tensorrt"] = json.loads(gpu.to_json(orient="index"))
    for name in ("fp16", "int8"):
        row = gpu.loc[f"tensorrt-{name}"]
        _say(
            f"tensorrt-{name} vs pytorch eager: p50 x{row['p50_ms'] / eager_ms:.2f}, "
            f"throughput x{row[f'fps@{serving}'] / eager_fps:.2f}"
        )
    gpu_accuracy = _accuracy(gpu_engines, held_out)  # onnxruntime view of TensorRT's graphs
    _say("\nper-slice accuracy of the TensorRT-flavoured graphs (onnxruntime):")
    _say(gpu_accuracy.round(4).to_string())


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--vehicles", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--width", type=int, default=None, help="default: training.yaml")
    parser.add_argument("--hidden", type=int, default=None, help="default: training.yaml")
    parser.add_argument("--quantization", default=None, help="JSON of quantization overrides")
    parser.add_argument("--profile", action="store_true", help="onnxruntime op profile")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    for name in ("rounds", "iterations", "epochs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return args


def _latency_report(latency: pd.DataFrame, serving: int) -> dict[str, Any]:
    """Flat ``<engine>_p50_ms`` … keys plus the issue's ``int8_speedup``."""
    report: dict[str, Any] = {}
    for name, row in latency.iterrows():
        key = str(name).replace("-", "_")
        report[f"{key}_p50_ms"] = round(float(row["p50_ms"]), 4)
        report[f"{key}_p99_ms"] = round(float(row["p99_ms"]), 4)
        report[f"{key}_fps"] = round(float(row[f"fps@{serving}"]), 1)
        report[f"{key}_peak_mb"] = round(float(row["peak_mb"]), 1)
        if name != "fp32":
            report[f"{key}_speedup"] = round(float(row["fps_vs_fp32"]), 3)
    return report


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every step above; the figures as one flat dictionary (what ``--json`` prints)."""
    settings, gates, spec = DeploymentSettings.load(), deployment_gates(), perception_spec()
    quantization = _quantization_settings(settings, args.quantization)
    started = time.perf_counter()
    frames = fleet_frames(args.vehicles, args.episodes, 0)
    train, held = split_logs(frames)
    _say(
        f"fleet: {len(frames)} frames, {frames['slice'].nunique()} slices "
        f"({time.perf_counter() - started:.0f} s); train {len(train)}, held out {len(held)}"
    )
    started = time.perf_counter()
    network, config = _build_network(args)
    _train(network, labelled(train), config, args.epochs, args.seed)
    calibration = labelled(sample(train, 256))
    held_out = labelled(held)
    exported = export_checked_onnx(
        network, calibration.head(32).inputs(), tolerance=1e-4, opset=settings.opset
    )
    int8, plan = shipped_int8(exported.onnx_bytes, calibration, quantization, gates, spec, settings)
    int8_all = quantize_int8(exported.onnx_bytes, calibration.inputs(), quantization)
    if quantization.camera_input:
        int8_all = with_camera_input(int8_all, calibration.images[:32]).onnx_bytes
    engines = {
        "fp32": exported.onnx_bytes,
        "fp16": convert_fp16(exported.onnx_bytes),
        "int8": int8,
        "int8-all": int8_all,
    }
    if quantization.camera_input:
        # The fair comparison for an engine that takes camera bytes: FP32 taking them too,
        # normalized inside the graph (onnxruntime's one pass instead of numpy's).
        engines["fp32-camera"] = _fp32_with_camera_input(exported.onnx_bytes)
    width, hidden = int(config["model"]["width"]), int(config["model"]["hidden"])
    report: dict[str, Any] = {
        "width": width,
        "hidden": hidden,
        "epochs": args.epochs,
        "threads": args.threads,
        "batch": settings.benchmark.serving_batch,
        "rounds": args.rounds,
        "parameters": sum(p.numel() for p in network.parameters()),
        "macs_per_frame": count_macs(network),
        **{f"{name.replace('-', '_')}_bytes": len(b) for name, b in engines.items()},
        **plan,
        "quantization": dataclasses.asdict(quantization),
    }
    _say(
        f"width {width}, hidden {hidden}: {report['macs_per_frame'] / 1e6:.1f} M MACs/frame; "
        f"trained {args.epochs} epochs, exported, quantized in "
        f"{time.perf_counter() - started:.0f} s; INT8 plan keeps "
        f"{plan['int8_fp32_nodes'] or 'no node'} in FP32 after "
        f"{plan['int8_fallback_steps']} fallback step(s)"
    )

    serving = settings.benchmark.serving_batch
    report["load_average_before"] = _load_average()
    latency = _cpu_latency(engines, held_out.images[:64], args, serving)
    report["load_average"] = _load_average()
    report.update(_latency_report(latency, serving))
    _say(f"\nonnxruntime CPU, {args.threads} intra-op thread(s), median of {args.rounds} rounds:")
    _say(latency.round(3).to_string())

    accuracy = _accuracy(engines, held_out)
    _say(f"\nper-slice accuracy on {len(held_out)} held-out frames (drop = FP32 - engine):")
    with pd.option_context("display.width", 200, "display.max_columns", 40):
        _say(accuracy.round(4).to_string())
    report.update(_slice_verdict(engines, held_out, gates["parity"]))
    if "fp32_camera_fps" in report:
        report["int8_speedup_vs_fp32_camera"] = round(
            report["int8_fps"] / report["fp32_camera_fps"], 3
        )
        _say(
            f"INT8 vs an FP32 engine that also takes camera bytes: throughput "
            f"x{report['int8_speedup_vs_fp32_camera']:.2f}"
        )
    _say(
        f"shipped INT8: throughput x{report['int8_speedup']:.2f} FP32, worst slice drop "
        f"{report['worst_slice_drop']:.4f} ({report['worst_slice']}); parity budget "
        f"{'held' if report['int8_within_parity_budget'] else 'breached'}"
    )
    if args.profile:
        serving = DeploymentSettings.load().benchmark.serving_batch
        for name in ("fp32", "int8"):
            report[f"{name}_profile"] = _profile(
                engines[name], held_out.images, args.threads, args.iterations
            )
            _say(f"\n{name} profile (batch 1):", json.dumps(report[f"{name}_profile"], indent=1))
            report[f"{name}_profile_serving"] = _profile(
                engines[name], held_out.images, args.threads, args.rounds * 5, batch=serving
            )
            _say(
                f"\n{name} profile (batch {serving}):",
                json.dumps(report[f"{name}_profile_serving"], indent=1),
            )
    _tensorrt(network, exported, engines, calibration, held_out, args, report)
    return report


def main() -> None:
    args = _arguments()
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        report = run(args)
    if args.json:
        print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
