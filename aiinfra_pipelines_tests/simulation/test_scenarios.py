"""Scenario files: parsing, validation errors that name the cause, ids and versions, and the
scripted hazards really happening in highway-env (cut-in, slow lead) — deterministically."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from aiinfra_pipelines.fleet.closed_loop import run_episode
from aiinfra_pipelines.simulation.scenarios import (
    ScenarioError,
    episode_for,
    load_base_scenarios,
    parse_family,
    parse_scenario_file,
)
from aiinfra_pipelines.simulation.settings import metrics_config

pytestmark = pytest.mark.timeout(120)

BASE = {"road_type": "highway", "weather": "clear", "lighting": "day", "duration_s": 3}


def family(**fields) -> dict:
    return {"family": "fam", "scenario": {**BASE, **fields}}


def parse(raw: dict) -> list:
    return parse_family(raw, "test.yaml", default_family="test")


def test_repository_scenario_files_are_valid():
    scenarios = load_base_scenarios()
    ids = [s.id for s in scenarios]
    assert len(ids) == len(set(ids)) and ids == sorted(ids)
    kinds = {s.road_type for s in scenarios}
    assert {"highway", "merge", "roundabout", "intersection"} <= kinds
    hazards = {e["type"] for s in scenarios for e in s.events}
    assert hazards == {"cut_in", "slow_lead"}
    assert any(s.degradation for s in scenarios), "a heavy-degradation scenario exists"
    assert any(s.traffic == "dense" for s in scenarios)


def test_matrix_expands_to_one_scenario_per_combination():
    raw = {
        **family(events=[{"type": "cut_in", "at_s": 1.0, "gap_m": 10.0}]),
        "matrix": {"lighting": ["day", "night"], "events.0.gap_m": [10.0, 20.0]},
    }
    scenarios = parse(raw)
    assert [s.id for s in scenarios] == [
        "fam-day-10.0",
        "fam-day-20.0",
        "fam-night-10.0",
        "fam-night-20.0",
    ]
    assert scenarios[3].lighting == "night" and scenarios[3].events[0]["gap_m"] == 20.0
    assert scenarios[3].slice == "night/clear/highway"
    # The version hashes the definition only: same fields, same version; any change, new one.
    again = parse(raw)
    assert [s.version for s in again] == [s.version for s in scenarios]
    assert len({s.version for s in scenarios}) == 4
    # Seeds derive from the id unless given: stable, and distinct per scenario.
    assert len({s.seed for s in scenarios}) == 4


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (family(weather="snow"), "weather 'snow' is not one of"),
        (family(road_type="offroad"), "road_type 'offroad'"),
        (family(traffic="jammed"), "traffic 'jammed' is not defined for road type 'highway'"),
        (family(duration_s=600), "duration_s 600.0 is outside"),
        (family(seed=-1), "seed must be an integer"),
        (family(colour="red"), "unknown scenario field(s) ['colour']"),
        (family(events=[{"type": "meteor"}]), "type 'meteor' is not one of"),
        (family(events=[{"type": "cut_in", "gap_m": 5.0}]), "cut_in needs ['at_s']"),
        (
            family(events=[{"type": "cut_in", "at_s": 1.0, "gap_m": 5.0, "speed": 3}]),
            "unknown cut_in parameter(s) ['speed']",
        ),
        (family(events=[{"type": "cut_in", "at_s": 9.0, "gap_m": 5.0}]), "at_s 9.0 is outside"),
        (family(events=[{"type": "cut_in", "at_s": 1.0, "gap_m": -5.0}]), "gap_m must be positive"),
        (
            family(events=[{"type": "slow_lead", "gap_m": 30.0, "speed_mps": 5, "brake_at_s": 1}]),
            "brake_at_s and brake_to_mps go together",
        ),
        (
            family(
                road_type="roundabout",
                events=[{"type": "slow_lead", "gap_m": 30.0, "speed_mps": 5}],
            ),
            "scripted events need a straight multi-lane road",
        ),
        (family(degradation={"snow": {"density": 1}}), "degradation.snow is not a fleet.yaml"),
        (family(degradation={"fog": {"thickness": 1}}), "unknown degradation.fog parameter"),
        (family(target_speeds_mps=[30, 20]), "target_speeds_mps must be increasing"),
        ({"family": "Bad Name", "scenario": BASE}, "family 'Bad Name' must match"),
        ({"scenario": BASE, "extra": 1}, "unknown top-level key(s) ['extra']"),
        ({"family": "fam"}, "`scenario:` must be a mapping"),
        ({**family(), "matrix": {"lighting": []}}, "matrix.lighting must be a non-empty list"),
        ({**family(), "matrix": {"sky": ["blue"]}}, "'sky' is not a scenario field"),
        ({**family(), "matrix": {"events.3.gap_m": [1.0]}}, "the scenario has no events[3]"),
    ],
)
def test_invalid_definitions_are_clear_errors(raw, message):
    with pytest.raises(ScenarioError) as error:
        parse(raw)
    assert message in str(error.value)
    assert str(error.value).startswith("test.yaml")


def test_bad_yaml_file_names_the_file(tmp_path: Path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("family: x\nscenario: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"broken\.yaml: not valid YAML"):
        parse_scenario_file(broken)
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(family()))
    (tmp_path / "twin.yaml").write_text(yaml.safe_dump(family()))
    with pytest.raises(ScenarioError, match="'fam' is already defined in"):
        load_base_scenarios(tmp_path)


def _scenario(**fields):
    [scenario] = parse(family(**fields))
    return scenario


def _run(scenario, observer=None, engine=None):
    setup, config, rng = episode_for(scenario)
    return run_episode(
        setup, rng, config=config, engine=engine, observer=observer, metrics_config=metrics_config()
    )


def test_same_scenario_same_metrics_and_frames():
    scenario = _scenario(weather="rain", lighting="night", traffic="dense")
    frames_a, frames_b = [], []
    a = _run(scenario, observer=lambda o: frames_a.append(o.image.tobytes()))
    b = _run(scenario, observer=lambda o: frames_b.append(o.image.tobytes()))
    assert a.deterministic_dict() == b.deterministic_dict()
    assert frames_a == frames_b
    other = _run(replace(scenario, seed=scenario.seed + 1))
    assert other.deterministic_dict() != a.deterministic_dict()


def test_cut_in_vehicle_moves_into_ego_lane_close_ahead():
    scenario = _scenario(
        traffic="light",
        duration_s=4,
        events=[{"type": "cut_in", "at_s": 1.0, "gap_m": 12.0, "speed_delta_mps": -3.0}],
    )
    lanes: list[dict[int, tuple[int, float]]] = []
    metrics = _run(
        scenario,
        observer=lambda o: lanes.append({v.vehicle_id: (v.lane_offset, v.x) for v in o.others}),
    )
    fired = [e["event"] for e in metrics.events]
    assert fired == ["cut_in_placed", "cut_in"]
    [cut] = [e for e in metrics.events if e["event"] == "cut_in"]
    assert cut["step"] == 5 and 8.0 < cut["gap_m"] < 16.0  # paced at the configured gap
    # The cutter: beside ego (offset ±1) before the cut, in ego's lane ahead after it.
    beside = {
        vid for vid, (offset, x) in lanes[cut["step"]].items() if abs(offset) == 1 and 5 < x < 20
    }
    later = lanes[-1]
    cutters = [vid for vid in beside if vid in later and later[vid][0] == 0 and later[vid][1] > 0]
    assert cutters, (
        f"no vehicle moved from beside ego into its lane: {lanes[cut['step']]} → {later}"
    )
    assert metrics.min_lead_gap_m is not None and metrics.min_lead_gap_m < 15.0


def test_slow_lead_is_ego_lead_and_brakes():
    scenario = _scenario(
        traffic="light",
        duration_s=4,
        target_speeds_mps=[5, 10, 15, 20, 25, 30],
        events=[
            {
                "type": "slow_lead",
                "gap_m": 40.0,
                "speed_mps": 14.0,
                "brake_at_s": 1.0,
                "brake_to_mps": 4.0,
            }
        ],
    )
    seen: list[dict[int, tuple[int, float, float]]] = []

    def record(observation) -> None:  # vehicle id -> (lane offset, gap, absolute speed)
        seen.append(
            {
                v.vehicle_id: (v.lane_offset, v.x, v.vx + observation.ego.speed_mps)
                for v in observation.others
            }
        )

    metrics = _run(scenario, observer=record)
    assert [e["event"] for e in metrics.events] == ["slow_lead_placed", "slow_lead_brake"]
    first = {vid: v for vid, v in seen[0].items() if v[0] == 0 and v[1] > 0}
    lead_id = min(first, key=lambda vid: first[vid][1])  # ego's lead at the start ...
    assert first[lead_id][1] == pytest.approx(40.0, abs=0.5)  # ... is where the file says
    assert first[lead_id][2] == pytest.approx(14.0, abs=0.5)
    assert seen[-1][lead_id][2] < 10.0  # and it braked
    # The planner (ground truth) reacted: it braked or left the lane, and did not crash.
    assert not metrics.collision
    assert (
        metrics.decisions["SLOWER"]
        + metrics.decisions["LANE_LEFT"]
        + metrics.decisions["LANE_RIGHT"]
        > 0
    )


def test_degradation_overrides_change_only_this_episode():
    scenario = _scenario(weather="fog", degradation={"fog": {"density": 0.95}})
    _, config, _ = episode_for(scenario)
    _, plain_config, _ = episode_for(_scenario(weather="fog"))
    assert config["degradation"]["fog"]["density"] == 0.95
    assert plain_config["degradation"]["fog"]["density"] != 0.95
    frames = []
    _run(replace(scenario, duration_s=1), observer=lambda o: frames.append(o.image))
    assert np.asarray(frames[0], dtype=float).std() < 15.0  # almost uniform grey
