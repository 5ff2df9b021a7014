"""A torch network's predictions on a frames table, and its per-slice benchmark metrics.

Plain functions (no Dagster) so the ``offline_eval`` asset and the offline recipe harness
(``benchmarks/recipe.py``) score a candidate with exactly the same code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.fleet.perception import fill_missing_lanes
from aiinfra_pipelines.perception.contract import decode_images, images_to_input, perception_spec
from aiinfra_pipelines.perception.labels import ground_truth_labels

from .frame_scores import FrameScores
from .slices import evaluate_by_slice


def predict(
    network: Any, frames: pd.DataFrame, batch_size: int = 128
) -> tuple[np.ndarray, np.ndarray]:
    """(occupancy probabilities N x 3 x bins, lead gap normalized N) of a torch network."""
    import torch

    spec = perception_spec()
    images = decode_images(list(frames["image"]), spec.image_height, spec.image_width)
    occupancy, gaps = [], []
    network = network.eval().cpu()
    with torch.inference_mode():
        for start in range(0, len(images), batch_size):
            batch = torch.from_numpy(images_to_input(images[start : start + batch_size]))
            logits, lead_gap = network(batch)
            occupancy.append(torch.sigmoid(logits).numpy())
            gaps.append(lead_gap.reshape(-1).numpy())
    return np.concatenate(occupancy), np.concatenate(gaps)


def slice_metrics(network: Any, frames: pd.DataFrame) -> pd.DataFrame:
    """``evaluate_by_slice`` of ``network`` against the ground-truth labels of ``frames``."""
    return scored_slices(network, frames)[0]


def scored_slices(network: Any, frames: pd.DataFrame) -> tuple[pd.DataFrame, FrameScores]:
    """(``evaluate_by_slice`` table, per-frame scores) of ``network`` on ``frames``.

    Scored as the car uses it: the network's occupancy with the map's missing lanes filled in
    (``fleet.perception.fill_missing_lanes``), the same for every model and for the baselines.
    """
    spec = perception_spec()
    occupancy_target, gap_target = ground_truth_labels(frames, spec)
    occupancy, gap = predict(network, frames)
    occupancy = fill_missing_lanes(
        occupancy, frames["lane_index"].to_numpy(), frames["lane_count"].to_numpy()
    )
    table = evaluate_by_slice(
        frames, occupancy, occupancy_target, gap, gap_target, spec.max_range_m
    )
    scores = FrameScores.of(occupancy, occupancy_target, gap, gap_target, spec.max_range_m)
    return table, scores
