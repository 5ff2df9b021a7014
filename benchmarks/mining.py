"""Badcase-mining throughput; prints figures, asserts nothing.

Three ways over the same real highway-env frames (160x64 rgb, tiled to ``--frames``) and the
same model (model zero, the bootstrap network), in one run:

1. pipeline — what the ``mined_badcases`` asset does per batch of new frames:
   ``run_engine_over_frames`` (decode image bytes in chunks, onnxruntime in batches of
   mining.yaml ``engine.batch_size``, sigmoid + confidence) + teacher labels + ``mine_badcases``;
2. bare onnxruntime — ``session.run`` over pre-decoded float32 NCHW batches of the same size
   (the floor: nothing but the graph);
3. per-frame PyTorch eager — ``PerceptionNet`` on one frame at a time under
   ``torch.inference_mode`` (how a naive script would mine), on a subset of the frames, with
   one torch thread (batch-1 convolutions are too small to split; with other processes on the
   2 cores, torch's default 2 threads measured up to 40x slower) and with the default.

All paths run once to warm up, then in ``--repeats`` interleaved rounds; each figure is the
median over rounds and each ratio the median of the per-round ratios.

    .venv/bin/python benchmarks/mining.py [--frames 2048] [--eager-frames 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # aiinfra_pipelines_tests

import onnxruntime as ort
import pandas as pd
import torch

from aiinfra_pipelines.mining.engine_runner import mining_engine, run_engine_over_frames
from aiinfra_pipelines.mining.rules import mine_badcases
from aiinfra_pipelines.mining.settings import EngineSettings, RuleSettings
from aiinfra_pipelines.perception.contract import (
    INPUT_NAME,
    LEAD_GAP_OUTPUT,
    OCCUPANCY_OUTPUT,
    decode_images,
    images_to_input,
    perception_spec,
)
from aiinfra_pipelines.perception.labels import ground_truth_labels
from aiinfra_pipelines.perception.onnx_export import bootstrap_network, export_onnx
from aiinfra_pipelines_tests.support.fleet_data import fleet_frames


def tiled_frames(n: int) -> pd.DataFrame:
    """``n`` real fleet frames: copies of a small fleet drive with distinct log ids."""
    base = fleet_frames(2, 1, 0)
    copies = []
    for copy in range(-(-n // len(base))):
        copies.append(base.assign(log_id=base["log_id"] + f"-c{copy:03d}"))
    return pd.concat(copies, ignore_index=True).iloc[:n].reset_index(drop=True)


def scene_index(frames: pd.DataFrame, rules: list[str]) -> pd.DataFrame:
    index = frames[["log_id", "frame_index", "slice", "lighting", "weather", "road_type"]].copy()
    for rule in rules:
        index[f"event_{rule}"] = False
    return index


def timed(run: Callable[[], object]) -> float:
    """Wall seconds of one run."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2048)
    parser.add_argument("--eager-frames", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    spec = perception_spec()
    config = None  # resources/mining.yaml
    engine_settings = EngineSettings.load(config)
    frames = tiled_frames(args.frames)
    index = scene_index(frames, list(RuleSettings.load(config).event_rules))
    net = bootstrap_network(spec)
    onnx_bytes = export_onnx(net)
    engine = mining_engine(onnx_bytes, spec, config)
    batch = engine.batch_size
    print(
        f"{len(frames)} frames {spec.image_width}x{spec.image_height}, batch {batch}, "
        f"chunk {engine_settings.chunk_batches} batches, torch threads "
        f"{torch.get_num_threads()}, cpu count {os.cpu_count()}"
    )

    # 1. The pipeline path, and its parts.
    def pipeline() -> pd.DataFrame:
        predictions = run_engine_over_frames(engine, frames, spec, config=config)
        labels = ground_truth_labels(frames, spec)
        return mine_badcases(frames, index, predictions, labels, config, spec=spec)

    predictions = run_engine_over_frames(engine, frames, spec, config=config)
    labels = ground_truth_labels(frames, spec)

    # 2. Bare onnxruntime over pre-decoded batches (same session options as the engine).
    images = decode_images(frames["image"].tolist(), spec.image_height, spec.image_width)
    batches = [images_to_input(images[i : i + batch]) for i in range(0, len(images), batch)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = engine_settings.intra_op_threads
    session = ort.InferenceSession(
        onnx_bytes, sess_options=options, providers=["CPUExecutionProvider"]
    )

    def bare() -> None:
        for item in batches:
            session.run([OCCUPANCY_OUTPUT, LEAD_GAP_OUTPUT], {INPUT_NAME: item})

    # 3. Per-frame PyTorch eager on a subset.
    n_eager = min(args.eager_frames, len(frames))
    tensors = [torch.from_numpy(images_to_input(images[i : i + 1])) for i in range(n_eager)]
    net.eval()

    default_threads = torch.get_num_threads()

    def eager_with(threads: int) -> Callable[[], None]:
        def eager() -> None:
            torch.set_num_threads(threads)
            try:
                with torch.inference_mode():
                    for tensor in tensors:
                        net(tensor)
            finally:
                torch.set_num_threads(default_threads)

        return eager

    paths: dict[str, Callable[[], object]] = {
        "pipeline": pipeline,
        "engine": lambda: run_engine_over_frames(engine, frames, spec, config=config),
        "labels": lambda: ground_truth_labels(frames, spec),
        "rules": lambda: mine_badcases(frames, index, predictions, labels, config, spec=spec),
        "bare": bare,
        "eager": eager_with(1),
        "eager_default": eager_with(default_threads),
    }
    badcases = pipeline()
    # Interleaved rounds: machine noise hits every path alike, and each round yields a ratio.
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.repeats):
        for name, run in paths.items():
            seconds[name].append(timed(run))
    n = len(frames)
    counts = {name: (n_eager if name.startswith("eager") else n) for name in paths}
    fps = {name: counts[name] / statistics.median(s) for name, s in seconds.items()}

    def ratio(a: str, b: str) -> float:
        rounds = zip(seconds[a], seconds[b], strict=True)
        return statistics.median((counts[a] / ta) / (counts[b] / tb) for ta, tb in rounds)

    print(f"badcases selected by model zero: {len(badcases)} of {n}")
    print(f"pipeline (decode + onnxruntime + labels + rules): {fps['pipeline']:9.1f} frames/s")
    print(f"  run_engine_over_frames alone:                  {fps['engine']:9.1f} frames/s")
    print(f"  ground_truth_labels alone:                     {fps['labels']:9.1f} frames/s")
    print(f"  mine_badcases (rules) alone:                   {fps['rules']:9.1f} frames/s")
    print(f"bare onnxruntime session.run, batch {batch:<3d}:       {fps['bare']:9.1f} frames/s")
    print(f"per-frame PyTorch eager, 1 thread ({n_eager} fr):   {fps['eager']:9.1f} frames/s")
    print(
        f"per-frame PyTorch eager, {default_threads} threads ({n_eager} fr):  "
        f"{fps['eager_default']:9.1f} frames/s"
    )
    print(f"ratio pipeline / bare onnxruntime:    {ratio('pipeline', 'bare'):.2f}")
    print(f"ratio engine path / bare onnxruntime: {ratio('engine', 'bare'):.2f}")
    print(f"ratio pipeline / per-frame eager:     {ratio('pipeline', 'eager'):.2f}")


if __name__ == "__main__":
    main()
