"""Small, valid, deterministic drive logs for tests across the project.

The fleet simulator produces the real data; this exists so that every layer's tests can start
from a log that passes validation without running highway-env, and can perturb exactly one
property (``make_synthetic_log(weather="snow")``) to test one failure.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from aiinfra_pipelines.logs.model import (
    METADATA_SCHEMA_VERSION,
    REQUIRED_METADATA_KEYS,
    DriveLog,
    Frame,
    OtherVehicle,
    TriggerEvent,
)

_VIN_ALPHABET = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789"  # ISO 3779 excludes I, O and Q
_METRES_PER_DEGREE = 111_320.0
_BASE_TIME = datetime(2024, 6, 1, 8, 0, 0, tzinfo=UTC)

# Shape options accepted as keyword overrides (anything else must be a metadata key).
_DEFAULT_OPTIONS: dict[str, Any] = {
    "frame_rate_hz": 10.0,
    "image_height": 48,
    "image_width": 128,
    "plates_per_frame": 3,
    # As a car uploads it: plates flattened by the vehicle anonymizer. False gives the raw
    # recording, readable plates and all (what the cloud's PII check must refuse).
    "vehicle_anonymized": True,
}


def _split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    options = dict(_DEFAULT_OPTIONS)
    metadata_overrides: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in _DEFAULT_OPTIONS:
            options[key] = value
        elif key in REQUIRED_METADATA_KEYS:
            metadata_overrides[key] = value
        else:
            known = sorted([*_DEFAULT_OPTIONS, *REQUIRED_METADATA_KEYS])
            raise TypeError(f"unknown override {key!r}; expected one of {known}")
    return options, metadata_overrides


def _vin(rng: np.random.Generator) -> str:
    return "".join(rng.choice(list(_VIN_ALPHABET), size=17))


def _metadata(seed: int, rng: np.random.Generator, overrides: dict[str, Any]) -> dict[str, str]:
    recorded_at = _BASE_TIME + timedelta(minutes=seed)
    metadata = {
        "metadata_schema_version": METADATA_SCHEMA_VERSION,
        "log_id": f"synthetic-{seed:06d}",
        "vin": _vin(rng),
        "vehicle_model": "sim-sedan-v1",
        "sensor_config_version": "cam-front-48x128-v1",
        "software_version": "engine-0.0.0-synthetic",
        "trigger_config_version": "triggers-v1",
        "city": "munich",
        "weather": "clear",
        "lighting": "day",
        "road_type": "highway",
        "recorded_at": recorded_at.isoformat(),
    }
    for key, value in overrides.items():
        if value is None:
            metadata.pop(key, None)  # lets a test build a log with a key missing
        else:
            metadata[key] = str(value)
    return metadata


def _image(rng: np.random.Generator, height: int, width: int, boxes: list[tuple]) -> np.ndarray:
    """A sky/road split with sensor noise and bright plates carrying dark glyph pixels."""
    rows = np.linspace(200, 60, height, dtype=np.float32)[:, None, None]
    base = np.broadcast_to(rows, (height, width, 3))
    image = np.clip(base + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)
    for x0, y0, x1, y1 in boxes:
        image[y0:y1, x0:x1] = 235
        glyphs = rng.random((y1 - y0, x1 - x0)) < 0.4
        image[y0:y1, x0:x1][glyphs] = 20
    return image


def _others(
    rng: np.random.Generator, count: int, height: int, width: int, frame_index: int
) -> list[OtherVehicle]:
    others = []
    for vehicle in range(count):
        x0 = min(width - 9, 8 + vehicle * (width // max(count, 1)) + frame_index % 4)
        y0 = min(height - 5, height // 2 + int(rng.integers(0, 6)))
        others.append(
            OtherVehicle(
                vehicle_id=vehicle + 1,
                x=float(15.0 + 12.0 * vehicle + rng.normal(0, 0.3)),
                y=float((vehicle - 1) * 3.5),
                vx=float(rng.normal(0, 0.5)),
                vy=float(rng.normal(0, 0.05)),
                lane_offset=vehicle - 1,
                plate_box=(x0, y0, x0 + 8, y0 + 4),
            )
        )
    return others


def _signals(rng: np.random.Generator, n_frames: int, dt: float) -> dict[str, np.ndarray]:
    """Gentle cruising with one hard brake in the middle, the event the trigger keeps."""
    accel = np.clip(rng.normal(0.0, 0.4, n_frames), -2.0, 2.0)
    brake = np.zeros(n_frames)
    middle = n_frames // 2
    accel[middle], brake[middle] = -5.0, 0.6
    speed = np.empty(n_frames)
    speed[0] = rng.uniform(15.0, 28.0)
    for i in range(1, n_frames):
        speed[i] = max(0.0, speed[i - 1] + accel[i - 1] * dt)
    steering = np.clip(rng.normal(0.0, 0.02, n_frames), -0.2, 0.2)
    heading = rng.uniform(-math.pi, math.pi) + np.cumsum(steering * dt * 0.5)
    return {"accel": accel, "brake": brake, "speed": speed, "steer": steering, "heading": heading}


def make_synthetic_log(n_frames: int = 20, seed: int = 0, **overrides: Any) -> DriveLog:
    """A valid log: ``n_frames`` at 10 Hz, 48x128 rgb8 frames with plates, one trigger event.

    ``overrides`` may set any metadata key (``None`` removes it) or one of ``frame_rate_hz``,
    ``image_height``, ``image_width``, ``plates_per_frame``, ``vehicle_anonymized``; unknown
    names raise ``TypeError`` so a typo in a test cannot silently produce a valid log.
    """
    options, metadata_overrides = _split_overrides(overrides)
    rng = np.random.default_rng(seed)
    metadata = _metadata(seed, rng, metadata_overrides)
    dt = 1.0 / float(options["frame_rate_hz"])
    height, width = int(options["image_height"]), int(options["image_width"])
    signals = _signals(rng, n_frames, dt)
    start_ns = int((_BASE_TIME + timedelta(minutes=seed)).timestamp() * 1e9)
    lat0 = 48.137154 + float(rng.uniform(-0.05, 0.05))
    lon0 = 11.576124 + float(rng.uniform(-0.05, 0.05))
    x = y = 0.0
    frames = []
    for i in range(n_frames):
        others = _others(rng, int(options["plates_per_frame"]), height, width, i)
        boxes = [other.plate_box for other in others if other.plate_box is not None]
        frames.append(
            Frame(
                timestamp_ns=start_ns + round(i * dt * 1e9),
                image=_image(rng, height, width, boxes),
                latitude=lat0 + y / _METRES_PER_DEGREE,
                longitude=lon0 + x / (_METRES_PER_DEGREE * math.cos(math.radians(lat0))),
                x=x,
                y=y,
                heading=float(signals["heading"][i]),
                speed_mps=float(signals["speed"][i]),
                accel_mps2=float(signals["accel"][i]),
                steering_rad=float(signals["steer"][i]),
                brake=float(signals["brake"][i]),
                lane_index=1,
                lane_count=3,
                others=others,
            )
        )
        x += float(signals["speed"][i] * dt * math.cos(signals["heading"][i]))
        y += float(signals["speed"][i] * dt * math.sin(signals["heading"][i]))
    events = []
    if n_frames:
        middle = frames[n_frames // 2]
        events.append(TriggerEvent(middle.timestamp_ns, "hard_brake", middle.accel_mps2, -4.0))
    log = DriveLog(metadata=metadata, frames=frames, events=events)
    return _vehicle_anonymized(log) if options["vehicle_anonymized"] else log


def _vehicle_anonymized(log: DriveLog) -> DriveLog:
    """The log through the car's anonymizer, as vehicle.yaml configures it."""
    from aiinfra_pipelines.vehicle.anonymizer import VehicleAnonymizer  # vehicle imports logs

    return VehicleAnonymizer.from_settings().anonymize(log)
