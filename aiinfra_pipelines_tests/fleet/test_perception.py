"""perception_from_ground_truth: the auto-label definition, on hand-built scenes."""

from __future__ import annotations

import numpy as np
import pytest

from aiinfra_pipelines.fleet.perception import (
    EGO_ROW,
    LEFT_ROW,
    RIGHT_ROW,
    Perception,
    fill_missing_lanes,
    perception_from_ground_truth,
)
from aiinfra_pipelines.logs.model import OtherVehicle

BINS = [-10.0, 0.0, 10.0, 20.0, 35.0, 50.0, 75.0]
MAX_RANGE = 75.0


def car(x: float, lane_offset: int, vehicle_id: int = 1) -> OtherVehicle:
    return OtherVehicle(
        vehicle_id, x=x, y=4.0 * lane_offset, vx=0.0, vy=0.0, lane_offset=lane_offset
    )


def test_empty_middle_lane_road_is_free() -> None:
    p = perception_from_ground_truth([], lane_index=1, lane_count=3, bins=BINS, max_range=MAX_RANGE)
    assert p.occupancy.shape == (3, len(BINS) - 1)
    assert not p.occupancy.any()
    assert p.lead_gap_m == MAX_RANGE
    assert p.confidence == 1.0


def test_vehicles_land_in_their_lane_and_bin() -> None:
    others = [car(15.0, 0), car(-5.0, 1, 2), car(60.0, -1, 3), car(40.0, 2, 4), car(200.0, 0, 5)]
    p = perception_from_ground_truth(others, 1, 3, BINS, MAX_RANGE)
    expected = np.zeros((3, 6), dtype=np.float32)
    expected[EGO_ROW, 2] = 1.0  # 15 m -> [10, 20)
    expected[LEFT_ROW, 0] = 1.0  # -5 m -> [-10, 0): beside/behind
    expected[RIGHT_ROW, 5] = 1.0  # 60 m -> [50, 75)
    np.testing.assert_array_equal(p.occupancy, expected)  # two lanes away / beyond range ignored
    assert p.lead_gap_m == pytest.approx(15.0)


def test_lead_gap_is_nearest_ahead_in_ego_lane_and_capped() -> None:
    p = perception_from_ground_truth(
        [car(30.0, 0), car(12.0, 0, 2), car(-3.0, 0, 3)], 1, 3, BINS, 75
    )
    assert p.lead_gap_m == pytest.approx(12.0)
    far = perception_from_ground_truth([car(90.0, 0)], 1, 3, BINS, MAX_RANGE)
    assert far.lead_gap_m == MAX_RANGE


def test_missing_lanes_count_as_occupied() -> None:
    leftmost = perception_from_ground_truth([], 0, 3, BINS, MAX_RANGE)
    assert leftmost.occupancy[LEFT_ROW].min() == 1.0
    assert leftmost.occupancy[RIGHT_ROW].max() == 0.0
    rightmost = perception_from_ground_truth([], 2, 3, BINS, MAX_RANGE)
    assert rightmost.occupancy[RIGHT_ROW].min() == 1.0
    assert rightmost.occupancy[LEFT_ROW].max() == 0.0
    single = perception_from_ground_truth([], 0, 1, BINS, MAX_RANGE)
    assert single.occupancy[LEFT_ROW].min() == single.occupancy[RIGHT_ROW].min() == 1.0
    unknown = perception_from_ground_truth([], 0, 0, BINS, MAX_RANGE)
    assert unknown.occupancy[[LEFT_ROW, RIGHT_ROW]].min() == 1.0


def test_pure_function_of_ground_truth() -> None:
    others = [car(15.0, 0), car(22.0, -1, 2)]
    a = perception_from_ground_truth(others, 1, 3, BINS, MAX_RANGE)
    b = perception_from_ground_truth(list(others), 1, 3, tuple(BINS), MAX_RANGE)
    np.testing.assert_array_equal(a.occupancy, b.occupancy)
    assert a.lead_gap_m == b.lead_gap_m


def test_invalid_inputs_are_rejected() -> None:
    with pytest.raises(ValueError):
        perception_from_ground_truth([], 1, 3, [0.0, 10.0, 5.0], MAX_RANGE)
    with pytest.raises(ValueError):
        Perception(np.zeros((2, 4)), 10.0, 1.0)
    with pytest.raises(ValueError):
        Perception(np.zeros((3, 4)), 10.0, 1.5)


def test_the_map_fills_missing_lanes_into_any_occupancy_batch() -> None:
    """A network's free side rows become occupied where the map says there is no lane."""
    network_output = np.zeros((3, 3, 6), dtype=np.float32)
    filled = fill_missing_lanes(network_output, np.array([0, 1, 2]), np.array([3, 3, 3]))
    assert filled[0, 0].tolist() == [1.0] * 6 and filled[0, 2].sum() == 0  # leftmost lane
    assert filled[1].sum() == 0  # middle lane: both neighbours exist, nothing filled
    assert filled[2, 2].tolist() == [1.0] * 6 and filled[2, 0].sum() == 0  # rightmost lane
    single_lane = fill_missing_lanes(np.full((3, 6), 0.2, dtype=np.float32), 0, 1)
    assert single_lane[:, 0].tolist() == pytest.approx([1.0, 0.2, 1.0])
    assert network_output.sum() == 0, "the input is not modified"
    with pytest.raises(ValueError, match="3 x bins"):
        fill_missing_lanes(np.zeros((2, 6)), 0, 1)


def test_ground_truth_perception_and_the_map_rule_agree() -> None:
    for lane_index, lane_count in [(0, 1), (0, 3), (1, 3), (2, 3)]:
        truth = perception_from_ground_truth([], lane_index, lane_count, BINS, MAX_RANGE)
        assert np.array_equal(
            truth.occupancy, fill_missing_lanes(np.zeros((3, 6)), lane_index, lane_count)
        )
