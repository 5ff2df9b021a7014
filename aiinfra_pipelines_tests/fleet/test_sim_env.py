"""Lane assignment along ego's route (fleet.sim_lanes): which lane a surrounding car is in."""

from __future__ import annotations

import math

import numpy as np
import pytest
from highway_env.road.lane import CircularLane, StraightLane

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.fleet.settings import fleet_config
from aiinfra_pipelines.fleet.sim_env import isolated_behaviour_class, make_env, render_frame
from aiinfra_pipelines.fleet.sim_ground_truth import GroundTruthReader
from aiinfra_pipelines.fleet.sim_lanes import lane_ahead, route_lane_offset, route_lanes

RADIUS = 9.0
WIDTH = 4.0


@pytest.fixture
def right_turn() -> list[CircularLane | StraightLane]:
    """Ego's route through a junction: a quarter turn of radius 9 m, then a straight exit."""
    arc = CircularLane(
        center=np.array([0.0, 0.0]),
        radius=RADIUS,
        start_phase=math.pi / 2,
        end_phase=0.0,
        clockwise=False,
        width=WIDTH,
    )
    end = arc.position(arc.length, 0.0)
    heading = arc.heading_at(arc.length)
    exit_lane = StraightLane(
        end, end + 60.0 * np.array([math.cos(heading), math.sin(heading)]), width=WIDTH
    )
    return [arc, exit_lane]


def test_a_car_at_the_arcs_radius_on_the_far_side_of_the_circle_is_not_in_egos_lane(
    right_turn: list,
) -> None:
    """The defect fleet-4 fixes: a circle's coordinates put it "in ego's lane"."""
    arc = right_turn[0]
    far_side = arc.center - (arc.position(arc.length / 2, 0.0) - arc.center)
    _, lateral = arc.local_coordinates(far_side)
    assert abs(lateral) < 1e-6  # what projecting onto the current lane alone concluded
    # Beside no route lane, or several lanes off the exit road: not in the occupancy grid.
    assert route_lane_offset(far_side, right_turn, 0.0, 2.0) not in (-1, 0, 1)
    assert route_lane_offset(far_side, right_turn[:1], 0.0, 2.0) is None


def test_cars_on_the_turn_and_on_the_exit_are_in_egos_lane(right_turn: list) -> None:
    arc, exit_lane = right_turn
    assert route_lane_offset(arc.position(arc.length * 0.7, 0.3), right_turn, 0.0, 2.0) == 0
    assert route_lane_offset(exit_lane.position(30.0, -0.5), right_turn, 0.0, 2.0) == 0


def test_the_lane_beside_the_route_is_one_lane_off(right_turn: list) -> None:
    arc, exit_lane = right_turn
    offsets = {
        route_lane_offset(lane.position(s, lateral), right_turn, 0.0, 2.0)
        for lane, s in ((arc, arc.length / 2), (exit_lane, 20.0))
        for lateral in (WIDTH, -WIDTH)
    }
    # highway-env's lateral grows to the right; lane_offset is +1 for the left lane.
    assert offsets == {-1, 1}


def test_behind_ego_the_current_lane_counts_back_to_first_lane_from(right_turn: list) -> None:
    exit_lane = right_turn[1]
    behind_start = exit_lane.position(-8.0, 0.0)
    assert route_lane_offset(behind_start, [exit_lane], -10.0, 2.0) == 0
    assert route_lane_offset(behind_start, [exit_lane], 0.0, 2.0) is None


@pytest.mark.parametrize("road_type", ["roundabout", "intersection"])
def test_the_route_covers_the_range_ahead_through_junctions(road_type: str) -> None:
    config = fleet_config(None)
    with isolated_behaviour_class(config):
        env = make_env(road_type, 3, config)
        try:
            ego = env.unwrapped.vehicle
            route_before = list(ego.route or [])
            lanes = route_lanes(env, 60.0, 6)
            assert list(ego.route or []) == route_before  # next_lane pops a copy, not ego's
            assert lanes[0] is ego.lane
            assert len(lanes) >= 2
        finally:
            env.close()


def test_on_the_highway_assignment_is_the_plain_lane_difference() -> None:
    """Straight road: the route lane's lateral coordinate is the ego-frame lateral offset."""
    config = fleet_config(None)
    camera = EgoCamera.from_config(config["camera"])
    seen = 0
    with isolated_behaviour_class(config):
        env = make_env("highway", 4, config)
        reader = GroundTruthReader(config)
        try:
            for _ in range(5):
                image = render_frame(env, camera)
                for other in reader.read(env, image):
                    if abs(other.x) < 80.0:
                        assert other.lane_offset == math.floor(other.y / WIDTH + 0.5)
                        seen += 1
                env.step(1)
        finally:
            env.close()
    assert seen > 0


def test_a_car_crossing_ahead_is_in_egos_lane_once_its_nose_is(right_turn: list) -> None:
    exit_lane = right_turn[1]
    centre = exit_lane.position(20.0, 3.5)  # centre in the next lane, 1.5 m past the boundary
    direction = exit_lane.position(21.0, 3.5) - centre
    across = np.array([-direction[1], direction[0]])  # perpendicular to the lane
    nose_in = np.array(
        [centre - 2.5 * across + s * direction for s in (-1.0, 1.0)]
        + [centre + 2.5 * across + s * direction for s in (-1.0, 1.0)]
    )
    assert route_lane_offset(centre, [exit_lane], 0.0, 2.0) in (-1, 1)
    assert route_lane_offset(centre, [exit_lane], 0.0, 2.0, body=nose_in) == 0
    aligned = np.array(
        [centre + s * 2.5 * direction + t * across for s in (-1, 1) for t in (-1, 1)]
    )
    assert route_lane_offset(centre, [exit_lane], 0.0, 2.0, body=aligned) in (-1, 1)


def test_the_lane_ahead_is_egos_lane_then_straight_on_from_its_end() -> None:
    config = fleet_config(None)
    with isolated_behaviour_class(config):
        env = make_env("intersection", 3, config)
        try:
            lane = env.unwrapped.vehicle.lane
            current, straight_on = lane_ahead(env, 50.0)
            assert current is lane
            assert np.allclose(straight_on.position(0.0, 0.0), lane.position(lane.length, 0.0))
            assert straight_on.length == pytest.approx(50.0)
            assert straight_on.heading == pytest.approx(lane.heading_at(lane.length))
        finally:
            env.close()


def test_an_unknown_lane_assignment_path_is_refused() -> None:
    config = fleet_config(None)
    broken = {
        **config,
        "ground_truth": {
            **config["ground_truth"],
            "lane_assignment": {**config["ground_truth"]["lane_assignment"], "path": "psychic"},
        },
    }
    with pytest.raises(ValueError, match="lane_ahead or route"):
        GroundTruthReader(broken)
