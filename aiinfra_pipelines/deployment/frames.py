"""Real driving frames with their labels, as every deployment step consumes them.

Export parity, calibration, sensitivity, the fallback loop and engine parity all run on frames
as the fleet recorded them (decoded rgb8 plus ground-truth labels and slice tags), never on
random tensors: a quantizer calibrated on noise fixes activation ranges no real frame has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from aiinfra_pipelines.datasets.calibration import coverage_report
from aiinfra_pipelines.perception.contract import (
    PerceptionSpec,
    decode_images,
    images_to_input,
    perception_spec,
)
from aiinfra_pipelines.perception.labels import ground_truth_labels

# Not REFERENCE_COLUMNS on purpose: tags name a frame and its slice, not where it is stored.
TAG_COLUMNS: tuple[str, ...] = (
    "log_id",
    "frame_index",
    "slice",
    "lighting",
    "weather",
    "road_type",
)


class CalibrationCoverageError(ValueError):
    """The calibration frames lack a condition the quantized engine must be calibrated for."""

    def __init__(self, conditions: list[str]) -> None:
        super().__init__(
            "calibration data is missing required slice condition(s): "
            + "; ".join(conditions)
            + " (gates.yaml calibration.min_share); an engine calibrated without them would "
            "clip exactly the activations those conditions produce"
        )
        self.conditions = conditions


@dataclass(frozen=True)
class LabelledFrames:
    """Frames aligned by position: tags, uint8 images, occupancy and normalized lead-gap labels."""

    tags: pd.DataFrame
    images: np.ndarray
    occupancy_target: np.ndarray
    lead_gap_target: np.ndarray

    def __len__(self) -> int:
        return len(self.images)

    def inputs(self) -> np.ndarray:
        """Float32 N x 3 x H x W in [0, 1]: what the exported graph takes."""
        return images_to_input(self.images)

    def head(self, n: int) -> LabelledFrames:
        return self.take(np.arange(min(n, len(self))))

    def spread(self, n: int) -> LabelledFrames:
        """``n`` frames evenly spaced over the set (deterministic): a small sample that still
        spans every log and slice, where the first ``n`` would be one drive."""
        if n >= len(self):
            return self
        return self.take(np.unique(np.linspace(0, len(self) - 1, n).round().astype(int)))

    def take(self, positions: np.ndarray) -> LabelledFrames:
        return LabelledFrames(
            tags=self.tags.iloc[positions].reset_index(drop=True),
            images=self.images[positions],
            occupancy_target=self.occupancy_target[positions],
            lead_gap_target=self.lead_gap_target[positions],
        )


def labelled_frames(frames: pd.DataFrame, spec: PerceptionSpec | None = None) -> LabelledFrames:
    """Decode a frames table (``load_frames`` output or test fleet frames) with its labels."""
    if frames.empty:
        raise ValueError("no frames: deployment steps need real driving frames")
    missing = [
        c for c in ("image", "ground_truth", "lane_index", "lane_count", "slice") if c not in frames
    ]
    if missing:
        raise ValueError(f"frames lack column(s) {missing}")
    spec = spec or perception_spec()
    frames = frames.reset_index(drop=True)
    occupancy, lead_gap = ground_truth_labels(frames, spec)
    return LabelledFrames(
        tags=frames[[c for c in TAG_COLUMNS if c in frames]].copy(),
        images=decode_images(list(frames["image"]), spec.image_height, spec.image_width),
        occupancy_target=occupancy,
        lead_gap_target=lead_gap,
    )


def require_calibration_coverage(
    tags: pd.DataFrame, min_share: Mapping[str, Mapping[str, float]]
) -> dict:
    """Refuse calibration frames that miss a condition share of gates.yaml ``calibration``.

    The ``calibration_set`` asset already guarantees the shares when it samples; this re-check
    protects the quantizer from any other source (an edited or truncated calibration table).
    Returns the coverage report for the record.
    """
    report = coverage_report(tags, min_share)
    if report["shortfalls"]:
        raise CalibrationCoverageError(report["shortfalls"])
    return report
