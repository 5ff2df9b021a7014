"""End-to-end fleet drives on a shrunken config: logs are valid, complete and deterministic."""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pytest

from aiinfra_pipelines.fleet.conditions import ROAD_TYPES, Conditions
from aiinfra_pipelines.fleet.settings import FleetConfig, with_overrides
from aiinfra_pipelines.fleet.sim_ground_truth import paint_plate
from aiinfra_pipelines.fleet.simulator import drive_episode, drive_fleet
from aiinfra_pipelines.fleet.triggers import TriggerConfig
from aiinfra_pipelines.fleet.vehicles import build_fleet
from aiinfra_pipelines.logs.model import (
    METADATA_SCHEMA_VERSION,
    OPTIONAL_METADATA_KEYS,
    REQUIRED_METADATA_KEYS,
    DriveLog,
)

pytestmark = pytest.mark.timeout(120)

# Bounds the ingest validator enforces; the simulator must stay inside them.
MIN_RATE_HZ, MAX_RATE_HZ = 2.0, 30.0
MIN_FRAMES = 5
MAX_SPEED, MAX_ACCEL, MAX_STEERING = 70.0, 15.0, 1.0


@pytest.fixture(scope="module")
def small_config() -> FleetConfig:
    """Short episodes and light traffic so the whole module runs in seconds."""
    return with_overrides(
        None,
        {
            "simulation": {
                "road_types": {
                    "highway": {
                        "max_duration_s": 6,
                        "env_config": {"vehicles_count": 8, "duration": 6},
                    },
                    "merge": {"max_duration_s": 6},
                    "roundabout": {"max_duration_s": 6},
                    "intersection": {"max_duration_s": 6},
                }
            }
        },
    )


@pytest.fixture(scope="module")
def triggers():
    return TriggerConfig.load()


def assert_valid(log: DriveLog, config: FleetConfig) -> None:
    """The checks the ingest validator will run, plus the schema's metadata contract."""
    meta = log.metadata
    assert set(meta) == {*REQUIRED_METADATA_KEYS, *OPTIONAL_METADATA_KEYS}
    assert all(isinstance(v, str) and v for v in meta.values())
    assert meta["metadata_schema_version"] == METADATA_SCHEMA_VERSION
    assert meta["vin"] not in meta["log_id"]
    assert meta["weather"] in {"clear", "rain", "fog"}
    assert meta["lighting"] in {"day", "night"}
    assert meta["road_type"] in set(ROAD_TYPES)
    recorded = datetime.fromisoformat(meta["recorded_at"])
    assert recorded.utcoffset() is not None and recorded.utcoffset().total_seconds() == 0
    assert int(recorded.timestamp() * 1e9) == pytest.approx(log.frames[0].timestamp_ns, abs=1e6)

    frames = log.frames
    assert len(frames) >= MIN_FRAMES
    ts = np.array([f.timestamp_ns for f in frames])
    assert np.all(np.diff(ts) > 0)
    rate = (len(frames) - 1) / log.duration_s
    assert MIN_RATE_HZ <= rate <= MAX_RATE_HZ
    assert rate == pytest.approx(config["simulation"]["policy_frequency_hz"])
    shape = (config["camera"]["height_px"], config["camera"]["width_px"], 3)
    for f in frames:
        assert f.image.shape == shape and f.image.dtype == np.uint8
        values = [f.latitude, f.longitude, f.x, f.y, f.heading, f.speed_mps, f.accel_mps2]
        values += [f.steering_rad, f.brake]
        assert all(math.isfinite(v) for v in values)
        assert 0.0 <= f.speed_mps <= MAX_SPEED
        assert abs(f.accel_mps2) <= MAX_ACCEL
        assert abs(f.steering_rad) <= MAX_STEERING
        assert 0.0 <= f.brake <= 1.0
        assert 0 <= f.lane_index < max(f.lane_count, 1)
        for o in f.others:
            assert all(math.isfinite(v) for v in (o.x, o.y, o.vx, o.vy))
            if o.plate_box is not None:
                x0, y0, x1, y1 = o.plate_box
                assert 0 <= x0 < x1 <= shape[1] and 0 <= y0 < y1 <= shape[0]
    for event in log.events:
        assert frames[0].timestamp_ns <= event.timestamp_ns <= frames[-1].timestamp_ns


def test_tiny_drive_produces_valid_logs(small_config: FleetConfig, triggers) -> None:
    progress: list[tuple[int, int]] = []
    logs = drive_fleet(
        1,
        1,
        seed=5,
        on_progress=lambda d, t: progress.append((d, t)),
        config=small_config,
        triggers=triggers,
    )
    assert progress == [(1, 1)]
    assert logs, "the stratified plan's first episode should trigger at least one segment"
    for log in logs:
        assert_valid(log, small_config)
        assert log.metadata["trigger_config_version"] == triggers.version
        assert log.events, "every uploaded segment carries the trigger that kept it"
    assert len({log.log_id for log in logs}) == len(logs)


def test_same_seed_same_bytes(small_config: FleetConfig, triggers) -> None:
    a = drive_fleet(1, 1, seed=11, config=small_config, triggers=triggers)
    b = drive_fleet(1, 1, seed=11, config=small_config, triggers=triggers)
    assert [log.metadata for log in a] == [log.metadata for log in b]
    assert [log.events for log in a] == [log.events for log in b]
    for la, lb in zip(a, b, strict=True):
        assert len(la.frames) == len(lb.frames)
        for fa, fb in zip(la.frames, lb.frames, strict=True):
            assert fa.image.tobytes() == fb.image.tobytes()
            assert (fa.timestamp_ns, fa.x, fa.speed_mps, fa.others) == (
                fb.timestamp_ns,
                fb.x,
                fb.speed_mps,
                fb.others,
            )
    c = drive_fleet(1, 1, seed=12, config=small_config, triggers=triggers)
    assert [log.log_id for log in c] != [log.log_id for log in a]


def test_every_road_type_drives(small_config: FleetConfig, triggers) -> None:
    """Each road type runs in the same action space; night forces an upload to inspect."""
    vehicle = build_fleet(1, config=small_config)[0]
    for index, road_type in enumerate(ROAD_TYPES):
        conditions = Conditions(road_type, "rain" if index % 2 else "fog", "night", vehicle.city)
        logs = drive_episode(vehicle, index, 3, conditions, small_config, triggers)
        assert logs, road_type
        for log in logs:
            assert_valid(log, small_config)
            assert log.metadata["road_type"] == road_type
        assert "night" in {e.rule for log in logs for e in log.events}


def test_episode_is_independent_of_what_ran_before(small_config: FleetConfig, triggers) -> None:
    """intersection-v0 mutates IDM class constants; the next episode must not notice."""
    vehicle = build_fleet(1, config=small_config)[0]
    highway = Conditions("highway", "clear", "night", vehicle.city)
    first = drive_episode(vehicle, 0, 9, highway, small_config, triggers)
    drive_episode(
        vehicle,
        1,
        9,
        Conditions("intersection", "clear", "day", vehicle.city),
        small_config,
        triggers,
    )
    again = drive_episode(vehicle, 0, 9, highway, small_config, triggers)
    assert [f.others for log in first for f in log.frames] == [
        f.others for log in again for f in log.frames
    ]


def test_plates_carry_glyphs_that_the_car_flattens_before_the_log_is_written(
    small_config: FleetConfig, triggers
) -> None:
    """Painted plates are readable (plate colour and glyphs); the logs a car keeps hold every
    plate box flattened to one colour, and say which anonymizer did it."""
    plate = small_config["camera"]["plate"]
    color = np.asarray(plate["color_rgb"], dtype=np.uint8)
    glyph = np.asarray(plate["glyph_rgb"], dtype=np.uint8)
    canvas = np.zeros((4, 8, 3), dtype=np.uint8)
    paint_plate(canvas, (1, 1, 7, 3), plate, number=5)
    painted = {tuple(pixel) for pixel in canvas[1:3, 1:7].reshape(-1, 3)}
    assert painted == {tuple(color), tuple(glyph)}
    assert not canvas[0].any() and not canvas[:, 0].any()  # nothing outside the box

    vehicle = build_fleet(1, config=small_config)[0]
    logs = drive_episode(
        vehicle, 0, 4, Conditions("highway", "clear", "day", vehicle.city), small_config, triggers
    )
    boxes = 0
    for log in logs:
        assert log.metadata["anonymizer_version"].startswith("vehicle-anon-")
        for f in log.frames:
            for o in f.others:
                if o.plate_box is not None:
                    x0, y0, x1, y1 = o.plate_box
                    assert len(np.unique(f.image[y0:y1, x0:x1].reshape(-1, 3), axis=0)) == 1
                    boxes += 1
    assert boxes > 0
