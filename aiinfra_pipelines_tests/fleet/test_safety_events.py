"""At-fault classification (nuPlan's rules) on constructed collisions, and on one driven one."""

from __future__ import annotations

import pytest

from aiinfra_pipelines.fleet.safety_events import (
    Collision,
    CollisionRules,
    CollisionType,
    Partner,
    classify_collision,
    fault_fields,
)

RULES = CollisionRules(
    stopped_speed_mps=0.05, comfort_decel_mps2=4.05, rear_end_after_harsh_brake_at_fault=True
)
LENGTH, WIDTH = 5.0, 2.0


def collision(
    *,
    ego_speed=15.0,
    ego_accel=0.0,
    straddles=False,
    x=-5.2,
    y=0.0,
    other_speed=20.0,
) -> Collision:
    """Ego and one other car, the frame before impact; by default a car 5.2 m behind closing."""
    return Collision(
        ego_speed_mps=ego_speed,
        ego_accel_mps2=ego_accel,
        ego_straddles_lanes=straddles,
        ego_length_m=LENGTH,
        ego_width_m=WIDTH,
        partner=Partner(x_m=x, y_m=y, speed_mps=other_speed),
    )


def test_rear_ended_while_stopped_is_not_at_fault():
    verdict = classify_collision(collision(ego_speed=0.0, x=-5.1, other_speed=8.0), RULES)
    assert verdict.kind is CollisionType.STOPPED_EGO and not verdict.at_fault


def test_ego_driving_into_a_stopped_lead_is_at_fault():
    verdict = classify_collision(collision(ego_speed=12.0, x=5.3, other_speed=0.0), RULES)
    assert verdict.kind is CollisionType.STOPPED_TRACK and verdict.at_fault


def test_ego_driving_into_a_slower_lead_is_at_fault():
    verdict = classify_collision(collision(ego_speed=25.0, x=5.4, y=0.3, other_speed=15.0), RULES)
    assert verdict.kind is CollisionType.ACTIVE_FRONT and verdict.at_fault


def test_rear_ended_while_braking_within_comfort_is_not_at_fault():
    verdict = classify_collision(collision(ego_speed=10.0, ego_accel=-3.0), RULES)
    assert verdict.kind is CollisionType.ACTIVE_REAR and not verdict.at_fault
    cruising = classify_collision(collision(ego_speed=20.0, ego_accel=0.5), RULES)
    assert not cruising.at_fault


def test_rear_ended_after_braking_harder_than_comfort_is_a_brake_check():
    """Our reading: a harsh brake that gets ego rear-ended is ego's fault (nuPlan: never)."""
    harsh = collision(ego_speed=10.0, ego_accel=-6.0)
    verdict = classify_collision(harsh, RULES)
    assert verdict.kind is CollisionType.ACTIVE_REAR and verdict.at_fault
    assert "comfort 4.05" in verdict.reason
    nuplan = CollisionRules(0.05, 4.05, rear_end_after_harsh_brake_at_fault=False)
    assert not classify_collision(harsh, nuplan).at_fault


def test_ego_changing_lanes_into_a_car_is_at_fault_a_car_swerving_into_ego_is_not():
    side = {"x": 2.0, "y": 2.1, "other_speed": 20.0}
    changing = classify_collision(collision(straddles=True, **side), RULES)
    assert changing.kind is CollisionType.ACTIVE_LATERAL and changing.at_fault
    keeping = classify_collision(collision(straddles=False, **side), RULES)
    assert keeping.kind is CollisionType.ACTIVE_LATERAL and not keeping.at_fault


def test_front_rear_or_lateral_from_where_the_other_car_was():
    # Offsets in vehicle lengths vs widths: 4 m ahead and 1.7 m aside is a side contact.
    assert classify_collision(collision(x=4.0, y=1.7), RULES).kind is CollisionType.ACTIVE_LATERAL
    assert classify_collision(collision(x=4.9, y=1.5), RULES).kind is CollisionType.ACTIVE_FRONT
    assert classify_collision(collision(x=-4.9, y=-1.5), RULES).kind is CollisionType.ACTIVE_REAR


def test_an_unknown_partner_does_not_exonerate_ego():
    record = Collision(15.0, 0.0, False, LENGTH, WIDTH, partner=None)
    verdict = classify_collision(record, RULES)
    assert verdict.kind is CollisionType.UNKNOWN and verdict.at_fault


def test_fault_fields_read_the_recorded_collision():
    detail = {
        "step": 7,
        "ego_speed_mps": 0.0,
        "ego_accel_mps2": -2.0,
        "ego_length_m": LENGTH,
        "ego_width_m": WIDTH,
        "ego_straddles_lanes": False,
        "partner": {"x_m": -5.1, "y_m": 0.1, "vx_mps": 6.0, "vy_mps": 0.0, "speed_mps": 6.0},
    }
    fields = fault_fields({"collision": True, "collision_detail": detail}, RULES)
    assert fields["collision_type"] == "stopped_ego" and fields["at_fault_collision"] is False
    assert fault_fields({"collision": False}, RULES)["at_fault_collision"] is False
    unrecorded = fault_fields({"collision": True, "collision_detail": None}, RULES)
    assert unrecorded["at_fault_collision"] is True


def test_the_repository_rules_load_and_are_sane():
    rules = CollisionRules.load()
    assert rules.comfort_decel_mps2 > 0 and rules.stopped_speed_mps >= 0
    with pytest.raises(ValueError, match="deceleration magnitude"):
        CollisionRules.load(
            {
                "collisions": {
                    "stopped_speed_mps": 0.05,
                    "comfort_decel_mps2": -4.0,
                    "rear_end_after_harsh_brake_at_fault": True,
                }
            }
        )


@pytest.mark.timeout(120)
def test_a_reckless_engine_into_a_stopped_lead_is_recorded_and_classified_at_fault():
    """Through highway-env: an engine that never sees the (nearly) stopped lead drives into it
    at full speed, and the runner records and classifies the collision."""
    from aiinfra_pipelines.simulation.runner import EngineSource, SimulationJob, simulate
    from aiinfra_pipelines.simulation.scenarios import build_scenario
    from aiinfra_pipelines_tests.support.simulation_engines import reckless_onnx

    scenario = build_scenario(
        {
            "road_type": "highway",
            "weather": "clear",
            "lighting": "day",
            "traffic": "light",
            "duration_s": 6,
            "seed": 3811425944,  # a traffic draw where the stopped lead is in ego's way
            "events": [{"type": "slow_lead", "gap_m": 30.0, "speed_mps": 0.0}],
        },
        scenario_id="reckless-into-slow-lead",
        kind="base",
        family="t",
    )
    engines = {"reckless": EngineSource("reckless", reckless_onnx())}
    (reckless,) = simulate([SimulationJob("reckless", scenario.to_dict())], engines, workers=1)
    assert reckless["collision"], "the reckless engine should hit the stopped lead"
    detail = reckless["collision_detail"]
    assert detail["partner"] is not None and detail["partner"]["x_m"] > 0  # it was ahead
    assert reckless["collision_type"] in {"active_front", "stopped_track"}
    assert reckless["at_fault_collision"] is True
    assert reckless["seed"] == scenario.seed
