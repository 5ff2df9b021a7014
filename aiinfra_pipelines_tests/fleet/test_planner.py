"""Rule planner: safety rules, fallback, and never steering where there is no road."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from aiinfra_pipelines.fleet.perception import Perception, perception_from_ground_truth
from aiinfra_pipelines.fleet.planner import (
    ACTION_NAMES,
    FASTER,
    IDLE,
    LANE_LEFT,
    LANE_RIGHT,
    SLOWER,
    PlannerConfig,
    RulePlanner,
)
from aiinfra_pipelines.logs.model import OtherVehicle


@pytest.fixture
def planner() -> RulePlanner:
    return RulePlanner()


def scene(others: list[tuple[float, int]], lane_index: int = 1, lane_count: int = 3) -> Perception:
    config = PlannerConfig.from_config()
    vehicles = [
        OtherVehicle(i, x=x, y=4.0 * offset, vx=0.0, vy=0.0, lane_offset=offset)
        for i, (x, offset) in enumerate(others)
    ]
    return perception_from_ground_truth(
        vehicles, lane_index, lane_count, config.bin_edges_m, config.max_range_m
    )


def test_action_indices_match_highway_env() -> None:
    from highway_env.envs.common.action import DiscreteMetaAction

    assert DiscreteMetaAction.ACTIONS_ALL == ACTION_NAMES


def test_accelerates_on_free_road(planner: RulePlanner) -> None:
    decision = planner.act(scene([], lane_index=2), ego_speed=20.0)
    assert decision.action == FASTER and decision.name == "FASTER" and not decision.fallback


def test_slows_for_close_lead(planner: RulePlanner) -> None:
    decision = planner.act(scene([(8.0, 0)]), ego_speed=25.0)
    assert decision.action == SLOWER and not decision.fallback


def test_slows_when_closing_fast(planner: RulePlanner) -> None:
    # The lead is far (2.8 s time gap) but stopped: the gap shrinks at ego speed, TTC < 3 s.
    first = planner.act(scene([(70.0, 0)]), ego_speed=25.0)
    assert first.action != SLOWER
    gap = 70.0 - 25.0 * planner.config.dt_s
    assert gap / 25.0 < planner.config.min_ttc_s
    assert planner.act(scene([(gap, 0)]), ego_speed=25.0).action == SLOWER


def test_overtakes_slow_lead_into_free_lane(planner: RulePlanner) -> None:
    # 40 m at 25 m/s = 1.6 s: too close to cruise, not close enough to brake.
    decision = planner.act(scene([(40.0, 0)]), ego_speed=25.0)
    assert decision.action == LANE_LEFT
    # Left blocked beside us: overtake on the right instead.
    planner.reset()
    decision = planner.act(scene([(40.0, 0), (-3.0, 1)]), ego_speed=25.0)
    assert decision.action == LANE_RIGHT
    # Both blocked: follow.
    planner.reset()
    decision = planner.act(scene([(40.0, 0), (-3.0, 1), (5.0, -1)]), ego_speed=25.0)
    assert decision.action == IDLE


def test_lane_change_cooldown_prevents_zigzag(planner: RulePlanner) -> None:
    assert planner.act(scene([(40.0, 0)]), ego_speed=25.0).action == LANE_LEFT
    assert planner.act(scene([(40.0, 0)]), ego_speed=25.0).action not in (LANE_LEFT, LANE_RIGHT)


def test_falls_back_on_low_confidence(planner: RulePlanner) -> None:
    free = scene([], lane_index=2)
    low = Perception(free.occupancy, free.lead_gap_m, confidence=0.1)
    decision = planner.act(low, ego_speed=25.0)
    assert decision.action == SLOWER and decision.fallback


def test_keeps_right_when_free(planner: RulePlanner) -> None:
    assert planner.act(scene([], lane_index=0), ego_speed=25.0).action == LANE_RIGHT


@pytest.mark.parametrize("lane_index,lane_count", [(0, 1), (0, 2), (1, 2), (0, 3), (2, 3)])
def test_never_steers_into_missing_lane(lane_index: int, lane_count: int) -> None:
    """Exhaustive over leads, neighbours and speeds: no lane change off the road."""
    leads = [None, 8.0, 25.0, 40.0, 60.0]
    for lead, speed in itertools.product(leads, [0.0, 5.0, 15.0, 30.0]):
        planner = RulePlanner()
        others = [] if lead is None else [(lead, 0)]
        for _ in range(3):
            action = planner.act(scene(others, lane_index, lane_count), speed).action
            if lane_index == 0:
                assert action != LANE_LEFT, (lead, speed)
            if lane_index == lane_count - 1:
                assert action != LANE_RIGHT, (lead, speed)


def test_deterministic_and_reset_restores_initial_state() -> None:
    perceptions = [scene([(x, 0)]) for x in np.linspace(70, 10, 12)]
    planner = RulePlanner()
    first = [planner.act(p, 25.0) for p in perceptions]
    planner.reset()
    assert [planner.act(p, 25.0) for p in perceptions] == first
    other = RulePlanner()
    assert [other.act(p, 25.0) for p in perceptions] == first


def test_nominal_state_runs_the_rules_unchanged() -> None:
    ruled, stated = RulePlanner(), RulePlanner()
    for others in ([], [(30.0, 0)], [(8.0, 0)], [(20.0, 0), (15.0, 1)]):
        perception = scene(others)
        assert stated.act_in_state("nominal", perception, 22.0) == ruled.act(perception, 22.0)


@pytest.mark.parametrize(
    ("state", "perceived", "reason"),
    [
        ("degraded", True, "degraded (low_confidence): conservative fallback"),
        ("minimal_risk", True, "minimal risk (low_confidence): slow to a stop in lane"),
        ("nominal", False, "no perception this frame"),
        ("degraded", False, "degraded (low_confidence): conservative fallback"),
    ],
)
def test_outside_nominal_or_without_perception_the_car_slows_in_lane(
    planner: RulePlanner, state: str, perceived: bool, reason: str
) -> None:
    # A free road and a free left lane: the rules would accelerate or change lanes.
    perception = scene([], lane_index=1) if perceived else None
    decision = planner.act_in_state(state, perception, 25.0, cause="low_confidence")
    assert (decision.action, decision.fallback, decision.reason) == (SLOWER, True, reason)


def test_an_unknown_state_is_an_error(planner: RulePlanner) -> None:
    with pytest.raises(ValueError, match="unknown degradation state"):
        planner.act_in_state("panicking", scene([]), 20.0)


def test_the_lead_gap_is_tracked_while_degraded(planner: RulePlanner) -> None:
    """Back in nominal, the closing speed is measured from the last degraded frame."""
    planner.act_in_state("degraded", scene([(70.0, 0)]), 25.0)
    gap = 70.0 - 25.0 * planner.config.dt_s
    decision = planner.act_in_state("nominal", scene([(gap, 0)]), 25.0)
    assert decision.action == SLOWER and "ttc" in decision.reason
