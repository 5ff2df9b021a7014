"""Run an engine over stored frames: the inference half of badcase mining.

Frames arrive as table rows holding raw rgb8 bytes. Decoding all of them at once would make
memory grow with the batch of new data (a day of fleet data is millions of frames), so frames
are decoded ``batch_size × chunk_batches`` at a time and only the small per-frame predictions
are kept. Chunks are whole multiples of the engine batch, so the engine sees exactly the
batches a one-shot ``infer`` would — chunking cannot change a single output bit.

Engines that expose ``run_raw`` (the onnxruntime engine) get a fast path: the uint8 → float32
NCHW conversion is done in one pass into a reused buffer instead of ``images_to_input``'s
copy-then-divide (9 ms → 2 ms per 64-frame batch on the reference CPU, where the graph itself
takes ~7–25 ms), then the engine's own ``outputs_to_predictions``. The result is bit-identical
to ``engine.infer`` (tested); other engines (TensorRT, test doubles) go through ``infer``.

``*_with_embeddings`` variants also return each frame's embedding from the same session run
(``run_raw_with_embedding``); None for engines whose graph has no embedding output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.fleet.perception import fill_missing_lanes
from aiinfra_pipelines.perception.contract import PerceptionSpec, decode_images
from aiinfra_pipelines.perception.engine import (
    Engine,
    OnnxRuntimeEngine,
    Predictions,
    outputs_to_predictions,
)

from .settings import EngineSettings

DEFAULT_BATCH_SIZE = 64


def mining_engine(
    onnx_bytes: bytes, spec: PerceptionSpec, config: dict[str, Any] | None = None
) -> OnnxRuntimeEngine:
    """The deployed ONNX model on onnxruntime with mining's batch size and threads (mining.yaml)."""
    settings = EngineSettings.load(config)
    return OnnxRuntimeEngine(
        onnx_bytes,
        spec,
        name="mining-onnxruntime",
        batch_size=settings.batch_size,
        intra_op_threads=settings.intra_op_threads,
    )


def empty_predictions(spec: PerceptionSpec) -> Predictions:
    """Zero-frame predictions with the right trailing shapes (concatenation-safe)."""
    return Predictions(
        occupancy=np.zeros((0, 3, spec.bins), dtype=np.float32),
        lead_gap_m=np.zeros(0, dtype=np.float32),
        confidence=np.zeros(0, dtype=np.float32),
    )


def concat_predictions(parts: list[Predictions], spec: PerceptionSpec) -> Predictions:
    """Stack per-chunk predictions in order."""
    if not parts:
        return empty_predictions(spec)
    return Predictions(
        occupancy=np.concatenate([p.occupancy for p in parts]),
        lead_gap_m=np.concatenate([p.lead_gap_m for p in parts]),
        confidence=np.concatenate([p.confidence for p in parts]),
    )


def _check_image_shape(frames: pd.DataFrame, spec: PerceptionSpec) -> None:
    """Refuse frames from another camera config before decoding garbage into the network."""
    for column, expected in (
        ("image_height", spec.image_height),
        ("image_width", spec.image_width),
    ):
        if column in frames.columns:
            wrong = frames[column].to_numpy() != expected
            if wrong.any():
                raise ValueError(
                    f"{int(wrong.sum())} frames have {column} != {expected} (the engine's input)"
                )


def images_to_input_into(images: np.ndarray, out: np.ndarray) -> np.ndarray:
    """uint8 N×H×W×3 → float32 N×3×H×W in [0, 1], written into ``out`` in one pass.

    Bit-identical to ``contract.images_to_input`` (float32(x) / 255 either way) without its
    intermediate float copy.
    """
    np.divide(images.transpose(0, 3, 1, 2), np.float32(255.0), out=out, dtype=np.float32)
    return out


def engine_has_embedding(engine: Any) -> bool:
    """Whether ``engine`` can return embeddings from its prediction run (new ONNX graphs)."""
    return bool(getattr(engine, "has_embedding", False)) and hasattr(
        engine, "run_raw_with_embedding"
    )


def _infer_raw(
    engine: Any, images: np.ndarray, spec: PerceptionSpec, batch_size: int, embeddings: bool
) -> tuple[Predictions, np.ndarray | None]:
    """``engine.infer`` for engines with ``run_raw``, with one-pass preprocessing.

    With ``embeddings`` the same session run also returns the embedding output.
    """
    camera_bytes = bool(getattr(engine, "takes_camera_bytes", False))
    buffer = np.empty(
        (min(batch_size, len(images)), 3, spec.image_height, spec.image_width), dtype=np.float32
    )
    occupancy_parts, gap_parts, embedding_parts = [], [], []
    for start in range(0, len(images), batch_size):
        frames = images[start : start + batch_size]
        # A camera-input INT8 graph takes the decoded frames as they are.
        batch = frames if camera_bytes else images_to_input_into(frames, buffer[: len(frames)])
        if embeddings:
            occupancy, lead_gap, embedding = engine.run_raw_with_embedding(batch)
            embedding_parts.append(embedding)
        else:
            occupancy, lead_gap = engine.run_raw(batch)
        occupancy_parts.append(occupancy)
        gap_parts.append(lead_gap)
    predictions = outputs_to_predictions(
        np.concatenate(occupancy_parts), np.concatenate(gap_parts), spec
    )
    return predictions, (np.concatenate(embedding_parts) if embeddings else None)


def run_engine_over_frames(
    engine: Engine,
    frames: pd.DataFrame,
    spec: PerceptionSpec,
    *,
    chunk_batches: int | None = None,
    config: dict[str, Any] | None = None,
) -> Predictions:
    """Predictions for every row of ``frames`` (same order), decoding images chunk by chunk.

    ``chunk_batches`` (default: mining.yaml ``engine.chunk_batches``) engine batches are decoded
    per chunk, so peak memory is bounded by the chunk, not by ``len(frames)``. The engine's
    ``batch_size`` attribute sets the batch (engines without one use 64). Engines with a
    ``run_raw(batch float32 NCHW) -> (occupancy logits, lead gap)`` method take the fast path
    described in the module docstring.
    """
    return run_engine_with_embeddings(
        engine, frames, spec, chunk_batches=chunk_batches, config=config, embeddings=False
    )[0]


def run_engine_with_embeddings(
    engine: Engine,
    frames: pd.DataFrame,
    spec: PerceptionSpec,
    *,
    chunk_batches: int | None = None,
    config: dict[str, Any] | None = None,
    embeddings: bool = True,
) -> tuple[Predictions, np.ndarray | None]:
    """``run_engine_over_frames`` plus each frame's embedding (N x D float32), one run for both.

    The embeddings are None when not asked for or when the engine's graph has no embedding
    output (engines exported before it existed): the predictions are the same either way.
    """
    if chunk_batches is None:
        chunk_batches = EngineSettings.load(config).chunk_batches
    if chunk_batches < 1:
        raise ValueError(f"chunk_batches must be >= 1, got {chunk_batches}")
    _check_image_shape(frames, spec)
    embeddings = embeddings and engine_has_embedding(engine)
    batch_size = int(getattr(engine, "batch_size", DEFAULT_BATCH_SIZE))
    chunk = batch_size * chunk_batches
    payloads = frames["image"].tolist() if len(frames) else []
    parts, vectors = [], []
    for start in range(0, len(payloads), chunk):
        images = decode_images(payloads[start : start + chunk], spec.image_height, spec.image_width)
        if hasattr(engine, "run_raw"):
            predictions, embedding = _infer_raw(engine, images, spec, batch_size, embeddings)
            parts.append(predictions)
            vectors.append(embedding)
        else:
            parts.append(engine.infer(images))
    if not embeddings:
        return concat_predictions(parts, spec), None
    width = int(getattr(engine, "embedding_dim", None) or 0)
    stacked = np.concatenate(vectors) if vectors else np.zeros((0, width), np.float32)
    return concat_predictions(parts, spec), stacked.astype(np.float32, copy=False)


def perceive_frames(
    engine: Engine, frames: pd.DataFrame, spec: PerceptionSpec, config: dict[str, Any] | None = None
) -> Predictions:
    """What the car's perception reported for each frame: the engine's occupancy with the
    map's missing lanes filled in from the frame's ``lane_index`` / ``lane_count``
    (``fleet.perception.fill_missing_lanes``), so mining and rollout comparisons judge the
    same output the planner acted on."""
    return perceive_frames_with_embeddings(engine, frames, spec, config, embeddings=False)[0]


def perceive_frames_with_embeddings(
    engine: Engine,
    frames: pd.DataFrame,
    spec: PerceptionSpec,
    config: dict[str, Any] | None = None,
    *,
    embeddings: bool = True,
) -> tuple[Predictions, np.ndarray | None]:
    """``perceive_frames`` and the frames' embeddings (None without them) from one engine run."""
    raw, vectors = run_engine_with_embeddings(
        engine, frames, spec, config=config, embeddings=embeddings
    )
    if len(frames) == 0:
        return raw, vectors
    filled = Predictions(
        occupancy=fill_missing_lanes(
            raw.occupancy, frames["lane_index"].to_numpy(), frames["lane_count"].to_numpy()
        ),
        lead_gap_m=raw.lead_gap_m,
        confidence=raw.confidence,
    )
    return filled, vectors
