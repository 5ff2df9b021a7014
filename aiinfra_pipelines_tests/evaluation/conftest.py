"""Fixtures for the evaluation tests: real fleet frames with ground-truth labels."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


@pytest.fixture(scope="module")
def labelled_fleet() -> tuple[pd.DataFrame, np.ndarray, np.ndarray, float]:
    """(frames, occupancy labels N×3×bins, lead gaps N normalized, max range) of a small fleet."""
    from aiinfra_pipelines.perception.contract import perception_spec
    from aiinfra_pipelines.perception.labels import ground_truth_labels
    from aiinfra_pipelines_tests.support.fleet_data import fleet_frames

    frames = fleet_frames(4, 2, 0)
    spec = perception_spec()
    occupancy, lead_gap = ground_truth_labels(frames, spec)
    return frames, occupancy, lead_gap, spec.max_range_m
