"""Auto-labels cover what the front camera can see, and nothing it cannot."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.labels import ground_truth_labels


def _frame(*vehicles: dict) -> pd.DataFrame:
    """One frame of a middle lane of a three-lane road with ``vehicles`` around ego."""
    return pd.DataFrame(
        {
            "ground_truth": [json.dumps(list(vehicles))],
            "lane_index": [1],
            "lane_count": [3],
        }
    )


def _car(x: float, y: float, lane_offset: int) -> dict:
    return {"vehicle_id": 1, "x": x, "y": y, "vx": 0.0, "vy": 0.0, "lane_offset": lane_offset}


def test_a_lead_on_the_far_side_of_a_ring_is_not_labelled() -> None:
    """Same ring (lane offset 0) but 30 m to the side: out of the image, so no lead."""
    camera = EgoCamera.load()
    assert not camera.sees(18.0, 30.0) and camera.sees(18.0, 1.0)
    spec = perception_spec()
    occupancy, lead_gap = ground_truth_labels(_frame(_car(18.0, 30.0, 0)), spec)
    assert occupancy.sum() == 0
    assert lead_gap[0] == pytest.approx(1.0)  # "no lead": the range cap


def test_a_lead_in_view_is_labelled_where_it_is() -> None:
    spec = perception_spec()
    occupancy, lead_gap = ground_truth_labels(_frame(_car(18.0, 0.5, 0)), spec)
    assert lead_gap[0] * spec.max_range_m == pytest.approx(18.0)
    assert occupancy[0, 1].sum() == 1  # one ego-lane cell
