"""Trigger rules fire on synthetic frame sequences; windows merge, cap and vanish correctly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.fleet.triggers import (
    FrameContext,
    TriggerConfig,
    TriggerRule,
    evaluate_triggers,
    select_segments,
)
from aiinfra_pipelines.logs.model import Frame, OtherVehicle, TriggerEvent

RATE_HZ = 5
PERIOD_NS = 1_000_000_000 // RATE_HZ
T0 = 1_700_000_000 * 1_000_000_000
CLEAR_DAY = FrameContext(weather="clear", lighting="day")


def frame(
    i: int, accel: float = 0.0, lane: int = 1, others: list[OtherVehicle] | None = None
) -> Frame:
    return Frame(
        timestamp_ns=T0 + i * PERIOD_NS,
        image=np.zeros((4, 4, 3), dtype=np.uint8),
        latitude=48.1,
        longitude=11.5,
        x=0.0,
        y=0.0,
        heading=0.0,
        speed_mps=20.0,
        accel_mps2=accel,
        steering_rad=0.0,
        brake=0.0,
        lane_index=lane,
        lane_count=3,
        others=others or [],
    )


@pytest.fixture
def config() -> TriggerConfig:
    return TriggerConfig.load()


def rules_fired(events: list[TriggerEvent]) -> list[str]:
    return [e.rule for e in events]


def test_config_loads_with_version_and_all_rules(config: TriggerConfig) -> None:
    assert config.version == load_resource_yaml("triggers.yaml")["version"]
    assert set(config.rules) == {
        "hard_brake",
        "low_ttc",
        "lane_change",
        "near_collision",
        "degradation",
        "night",
        "rain",
        "fog",
    }


def test_unknown_rule_is_an_error() -> None:
    raw = dict(load_resource_yaml("triggers.yaml"))
    raw["rules"] = {**raw["rules"], "hard_brak": {"pre_s": 1, "post_s": 1, "threshold": -1}}
    with pytest.raises(ValueError, match="hard_brak"):
        TriggerConfig.load(raw)


def test_quiet_drive_fires_nothing_and_uploads_nothing(config: TriggerConfig) -> None:
    frames = [frame(i) for i in range(50)]
    events = evaluate_triggers(frames, CLEAR_DAY, config)
    assert events == []
    assert select_segments(frames, events, config) == []


def test_hard_brake_fires_below_threshold(config: TriggerConfig) -> None:
    threshold = config.rules["hard_brake"].threshold
    frames = [frame(i, accel=threshold - 1.0 if i == 20 else 0.0) for i in range(50)]
    events = evaluate_triggers(frames, CLEAR_DAY, config)
    assert rules_fired(events) == ["hard_brake"]
    assert events[0].timestamp_ns == frames[20].timestamp_ns
    assert events[0].value < events[0].threshold == threshold


def test_low_ttc_fires_for_fast_approach(config: TriggerConfig) -> None:
    rule = config.rules["low_ttc"]
    gap = 10.0
    closing = gap / (rule.threshold / 2)
    lead = OtherVehicle(
        1, x=gap + rule.params["vehicle_length_m"], y=0.0, vx=-closing, vy=0.0, lane_offset=0
    )
    slow_lead = OtherVehicle(1, x=lead.x, y=0.0, vx=+1.0, vy=0.0, lane_offset=0)
    frames = [frame(i, others=[lead] if i == 10 else [slow_lead]) for i in range(30)]
    events = evaluate_triggers(frames, CLEAR_DAY, config)
    assert rules_fired(events) == ["low_ttc"]
    assert events[0].value == pytest.approx(rule.threshold / 2)


def test_lane_change_fires_on_index_change_but_not_on_new_road_piece(config: TriggerConfig) -> None:
    frames = [frame(i, lane=1 if i < 15 else 0) for i in range(30)]
    events = evaluate_triggers(frames, CLEAR_DAY, config)
    assert rules_fired(events) == ["lane_change"]
    assert events[0].timestamp_ns == frames[15].timestamp_ns
    edges = ["a->b"] * 15 + ["b->c"] * 15
    entering = FrameContext("clear", "day", road_edges=edges)
    assert evaluate_triggers(frames, entering, config) == []


def test_near_collision_fires_on_proximity_or_crash(config: TriggerConfig) -> None:
    rule = config.rules["near_collision"]
    close = OtherVehicle(
        1, x=rule.params["vehicle_length_m"] + 0.5, y=0.3, vx=0.0, vy=0.0, lane_offset=0
    )
    beside = OtherVehicle(2, x=1.0, y=4.0, vx=0.0, vy=0.0, lane_offset=1)  # next lane: fine
    frames = [frame(i, others=[close] if i == 5 else [beside]) for i in range(20)]
    assert rules_fired(evaluate_triggers(frames, CLEAR_DAY, config)) == ["near_collision"]
    quiet = [frame(i) for i in range(20)]
    crashed = FrameContext("clear", "day", crashed=[i == 19 for i in range(20)])
    events = evaluate_triggers(quiet, crashed, config)
    assert rules_fired(events) == ["near_collision"]
    assert events[0].timestamp_ns == quiet[19].timestamp_ns


def test_degradation_fires_on_every_state_change_and_keeps_it_in_a_segment(
    config: TriggerConfig,
) -> None:
    frames = [frame(i) for i in range(40)]
    levels = [0] * 5 + [1] * 15 + [2] * 10 + [0] * 10  # degraded, minimal risk, recovered
    context = FrameContext(weather="clear", lighting="day", degradation_levels=levels)
    events = evaluate_triggers(frames, context, config)
    assert [(e.rule, e.timestamp_ns, e.value) for e in events] == [
        ("degradation", frames[5].timestamp_ns, 1.0),
        ("degradation", frames[20].timestamp_ns, 2.0),
        ("degradation", frames[30].timestamp_ns, 0.0),
    ]
    segments = select_segments(frames, events, config)
    for event in events:
        index = (event.timestamp_ns - T0) // PERIOD_NS
        assert any(start <= index < end for start, end in segments)
    # Without the car's levels (a real fleet's frames alone) the rule stays silent.
    assert evaluate_triggers(frames, CLEAR_DAY, config) == []


@pytest.mark.parametrize(
    "weather,lighting,expected",
    [("clear", "night", "night"), ("rain", "day", "rain"), ("fog", "day", "fog")],
)
def test_condition_triggers_fire_rate_limited(
    config: TriggerConfig, weather: str, lighting: str, expected: str
) -> None:
    frames = [frame(i) for i in range(RATE_HZ * 25)]  # 25 s
    events = evaluate_triggers(frames, FrameContext(weather, lighting), config)
    cooldown = config.rules[expected].cooldown_s
    assert set(rules_fired(events)) == {expected}
    assert len(events) == int(25 // cooldown) + 1
    segments = select_segments(frames, events, config)
    assert len(segments) == len(events)
    # Bounded uploads: the drive is sampled in short windows, not uploaded whole.
    rule = config.rules[expected]
    window = round((rule.pre_s + rule.post_s) * RATE_HZ) + 1
    assert all(end - start <= window for start, end in segments)
    assert sum(end - start for start, end in segments) < len(frames)


def test_overlapping_windows_merge(config: TriggerConfig) -> None:
    frames = [frame(i) for i in range(100)]
    events = [
        TriggerEvent(frames[20].timestamp_ns, "hard_brake", -6.0, -4.0),
        TriggerEvent(frames[25].timestamp_ns, "lane_change", 1.0, 1.0),
        TriggerEvent(frames[80].timestamp_ns, "hard_brake", -6.0, -4.0),
    ]
    pre = round(config.rules["hard_brake"].pre_s * RATE_HZ)
    post_lc = round(config.rules["lane_change"].post_s * RATE_HZ)
    post_hb = round(config.rules["hard_brake"].post_s * RATE_HZ)
    assert select_segments(frames, events, config) == [
        (20 - pre, 25 + post_lc + 1),
        (80 - pre, 80 + post_hb + 1),
    ]


def test_windows_clip_to_the_drive_and_widen_to_min_frames() -> None:
    config = TriggerConfig(
        version="t",
        rules={"hard_brake": TriggerRule("hard_brake", pre_s=0.0, post_s=0.0, threshold=-4.0)},
        max_segment_s=10.0,
        min_frames=5,
    )
    frames = [frame(i) for i in range(30)]
    at = [TriggerEvent(frames[i].timestamp_ns, "hard_brake", -5.0, -4.0) for i in (0, 15, 29)]
    assert select_segments(frames, at, config) == [(0, 5), (13, 18), (25, 30)]
    assert select_segments(frames[:3], at[:1], config) == []  # a drive too short to upload


def test_long_merged_window_is_split_under_max_segment(config: TriggerConfig) -> None:
    frames = [frame(i) for i in range(RATE_HZ * 60)]
    events = [TriggerEvent(f.timestamp_ns, "hard_brake", -5.0, -4.0) for f in frames[::5]]
    segments = select_segments(frames, events, config)
    assert len(segments) > 1
    assert segments[0][0] == 0 and segments[-1][1] == len(frames)
    for (_, end), (start, _) in itertools.pairwise(segments):
        assert end == start  # contiguous, nothing lost
    max_frames = config.max_segment_s * RATE_HZ + 1
    assert all(config.min_frames <= end - start <= max_frames for start, end in segments)
