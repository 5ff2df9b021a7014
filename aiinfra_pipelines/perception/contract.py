"""Shapes and encodings every producer and consumer of perception tensors agrees on.

Input: camera frames as stored (uint8, H x W x 3, rgb8) become float32 NCHW in [0, 1]; an
INT8 engine built with camera input (deployment.camera_input) takes the uint8 frames as they
are, under the same input name.
Output: per lane (left, ego, right) × distance bin occupancy logits, and the gap to the lead
vehicle normalized by the sensing range. The bin edges and range come from
``resources/fleet.yaml`` so labels, model and planner can never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aiinfra_pipelines.config import settings_section

INPUT_NAME = "image"
OCCUPANCY_OUTPUT = "occupancy_logits"
LEAD_GAP_OUTPUT = "lead_gap"
# Optional third output: the network's penultimate features (N x D float32), what frame
# similarity compares. Engines exported before it existed lack it; consumers must cope.
EMBEDDING_OUTPUT = "embedding"
LANES = 3
# The ONNX opset every exported engine uses (onnxruntime and TensorRT both support it).
ONNX_OPSET = 17


@dataclass(frozen=True)
class PerceptionSpec:
    image_height: int
    image_width: int
    bin_edges_m: tuple[float, ...]
    max_range_m: float

    @property
    def bins(self) -> int:
        return len(self.bin_edges_m) - 1

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> PerceptionSpec:
        """From ``fleet.yaml`` ``camera`` and ``perception`` (or ``config``, the whole file)."""
        camera = settings_section("fleet.yaml", "camera", config)
        perception = settings_section("fleet.yaml", "perception", config)
        return cls(
            image_height=camera.int("height_px"),
            image_width=camera.int("width_px"),
            bin_edges_m=tuple(float(edge) for edge in perception.list("bin_edges_m")),
            max_range_m=perception.float("max_range_m"),
        )


def perception_spec() -> PerceptionSpec:
    """``PerceptionSpec.load()``: the deployed contract (the shorthand its many callers use)."""
    return PerceptionSpec.load()


def images_to_input(images: np.ndarray) -> np.ndarray:
    """uint8 N x H x W x 3 → float32 N x 3 x H x W in [0, 1] (what the network consumes).

    float32(x) / 255, written in one pass into the result (no intermediate float copy): this
    conversion costs a float engine about a third of its time at the serving batch.
    """
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"expected N x H x W x 3 images, got shape {images.shape}")
    out = np.empty((images.shape[0], 3, *images.shape[1:3]), dtype=np.float32)
    np.divide(images.transpose(0, 3, 1, 2), np.float32(255.0), out=out, dtype=np.float32)
    return out


def session_takes_camera_bytes(session: Any) -> bool:
    """Whether an onnxruntime session's graph takes the uint8 frames as stored (an INT8 engine
    with camera input) rather than float32 N x 3 x H x W."""
    return session.get_inputs()[0].type == "tensor(uint8)"


def input_to_images(inputs: np.ndarray) -> np.ndarray:
    """float32 N x 3 x H x W from :func:`images_to_input` → the uint8 N x H x W x 3 frames.

    Exact for such inputs (each value is k / 255), so a caller holding network inputs can feed
    an engine that takes camera bytes.
    """
    if inputs.ndim != 4 or inputs.shape[1] != 3:
        raise ValueError(f"expected N x 3 x H x W inputs, got shape {inputs.shape}")
    scaled = np.rint(inputs.transpose(0, 2, 3, 1) * np.float32(255.0))
    return np.ascontiguousarray(np.clip(scaled, 0, 255), dtype=np.uint8)


def decode_images(payloads, height: int, width: int) -> np.ndarray:
    """Raw rgb8 bytes (as stored in ``anonymized_frames``) → uint8 N x H x W x 3."""
    buffer = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    expected = len(payloads) * height * width * 3
    if buffer.size != expected:
        raise ValueError(
            f"image bytes {buffer.size} do not match {len(payloads)} x {height}x{width}x3"
        )
    return buffer.reshape(len(payloads), height, width, 3)


def confidence_from_probabilities(occupancy: np.ndarray) -> np.ndarray:
    """Per-frame confidence: mean certainty |2p - 1| over the occupancy grid (0 = coin flip)."""
    return np.abs(2.0 * occupancy - 1.0).reshape(occupancy.shape[0], -1).mean(axis=1)


def sigmoid(values: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-values))
