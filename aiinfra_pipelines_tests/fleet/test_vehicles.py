"""Fleet identities and the conditions plan."""

from __future__ import annotations

import pytest

from aiinfra_pipelines.fleet.conditions import (
    LIGHTINGS,
    ROAD_TYPES,
    WEATHERS,
    Conditions,
    plan_conditions,
)
from aiinfra_pipelines.fleet.settings import fleet_config, with_overrides
from aiinfra_pipelines.fleet.vehicles import (
    VIN_CHARSET,
    build_fleet,
    city_by_name,
    is_valid_vin,
    local_to_gps,
    vin_check_digit,
)


def test_known_vin_check_digit() -> None:
    # The textbook example VIN 1M8GDM9AXKP042788 has check digit X.
    assert vin_check_digit("1M8GDM9AXKP042788") == "X"
    assert is_valid_vin("1M8GDM9AXKP042788")
    assert not is_valid_vin("1M8GDM9A1KP042788")


def test_fleet_vins_are_valid_unique_and_stable() -> None:
    fleet = build_fleet(20)
    vins = [v.vin for v in fleet]
    assert len(set(vins)) == 20
    for vin in vins:
        assert len(vin) == 17 and set(vin) <= set(VIN_CHARSET) and is_valid_vin(vin)
        assert not set(vin) & {"I", "O", "Q"}
    assert [v.vin for v in build_fleet(20)] == vins


def test_fleet_models_cities_and_software_version() -> None:
    cfg = fleet_config()
    fleet = build_fleet(4)
    models = {m["name"] for m in cfg["fleet"]["vehicle_models"]}
    assert {v.model for v in fleet} == models
    assert {v.city for v in fleet} <= set(cfg["fleet"]["cities"])
    assert {v.software_version for v in fleet} == {cfg["fleet"]["default_software_version"]}
    released = build_fleet(2, software_version="engine-v0007")
    assert {v.software_version for v in released} == {"engine-v0007"}


def test_gps_mapping_is_metric_around_the_origin() -> None:
    munich = city_by_name("munich")
    lat, lon = local_to_gps(0.0, 0.0, munich)
    assert (lat, lon) == (munich.latitude, munich.longitude)
    lat_n, _ = local_to_gps(0.0, 1000.0, munich)
    assert lat_n - munich.latitude == pytest.approx(1000.0 / 111_320, rel=0.01)
    _, lon_e = local_to_gps(1000.0, 0.0, munich)
    assert lon_e > munich.longitude


def test_stratified_plan_covers_every_slice_in_a_demo_fleet() -> None:
    plan = plan_conditions(["munich", "berlin", "hamburg", "munich"], episodes=2, seed=3)
    flat = [c for row in plan for c in row]
    assert len(flat) == 8
    assert {c.road_type for c in flat} == set(ROAD_TYPES)
    assert {c.weather for c in flat} == set(WEATHERS)
    assert {c.lighting for c in flat} == set(LIGHTINGS)
    assert [c.city for c in plan[1]] == ["berlin", "berlin"]
    assert plan == plan_conditions(["munich", "berlin", "hamburg", "munich"], 2, seed=3)


def test_random_plan_uses_configured_categories() -> None:
    cfg = with_overrides(None, {"conditions": {"strategy": "random"}})
    plan = plan_conditions(["munich"] * 10, episodes=5, seed=1, config=cfg)
    assert all(isinstance(c, Conditions) for row in plan for c in row)


def test_conditions_reject_unknown_categories() -> None:
    with pytest.raises(ValueError):
        Conditions("autobahn", "clear", "day", "munich")
    with pytest.raises(ValueError):
        Conditions("highway", "snow", "day", "munich")
