"""A tiny real fleet drive with the full recording rig, shared by the rig tests (cached).

Two cars, one short highway episode each (well under a second of highway-env); car 1 has the
clock-skew fault of fleet.yaml ``faults`` switched on, car 0 is healthy.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from aiinfra_pipelines.fleet.settings import FleetConfig, with_overrides
from aiinfra_pipelines.fleet.simulator import drive_fleet
from aiinfra_pipelines.logs.model import DriveLog

SKEWED_VEHICLE = 1
SEED = 5


def rig_config(**overrides: Any) -> FleetConfig:
    """Short highway episodes with light traffic, car 1's LiDAR clock skewed, plus overrides."""
    base = {
        "simulation": {
            "road_types": {
                "highway": {"max_duration_s": 6, "env_config": {"vehicles_count": 8, "duration": 6}}
            }
        },
        "conditions": {"road_types": ["highway"]},
        "faults": {"clock_skew": {"vehicles": [SKEWED_VEHICLE]}},
    }
    return with_overrides(with_overrides(None, base), overrides)


@lru_cache(maxsize=4)
def rig_drive(encoding: str = "jpeg") -> tuple[DriveLog, ...]:
    """Every log the two cars keep; ``encoding`` is fleet.yaml's ``camera.encoding`` knob."""
    config = rig_config(camera={"encoding": encoding})
    return tuple(drive_fleet(2, 1, seed=SEED, config=config))


def vehicle_index(log: DriveLog) -> int:
    """Which car of the drive recorded ``log`` (its VIN's serial, as vehicles.build_fleet makes)."""
    return int(log.metadata["vin"][-3:])


def healthy_logs(encoding: str = "jpeg") -> list[DriveLog]:
    return [log for log in rig_drive(encoding) if vehicle_index(log) != SKEWED_VEHICLE]


def skewed_logs(encoding: str = "jpeg") -> list[DriveLog]:
    return [log for log in rig_drive(encoding) if vehicle_index(log) == SKEWED_VEHICLE]
