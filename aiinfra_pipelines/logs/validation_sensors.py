"""Channel and sensor-rig checks: required channels, calibration, transforms, clocks.

These look at the recording rather than the frames decoded from it, and hold a simulated
fleet log and a real car's log to the same standard through the source profiles.
"""

from __future__ import annotations

from typing import Any

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.message_decode import check_schemas
from aiinfra_pipelines.logs.model import REQUIRED_TOPICS, DriveLog
from aiinfra_pipelines.logs.reader import ScannedLog
from aiinfra_pipelines.logs.sources.build import ClockSync, ProfileLogBuilder, clock_sync
from aiinfra_pipelines.logs.validation_report import Reason


def check_channels(scanned: ScannedLog) -> list[Reason]:
    """Required channels must exist with at least one message, with the schema we write."""
    counts = scanned.message_counts()
    reasons = [
        Reason(errors.MISSING_CHANNEL, f"required channel {topic} has no messages")
        for topic in REQUIRED_TOPICS
        if counts.get(topic, 0) == 0
    ]
    reasons += [
        Reason(problem.code, problem.message)
        for problem in check_schemas(scanned.channels, scanned.schemas)
    ]
    return reasons


def required_sensor_roles(metadata: dict[str, str], rules: dict[str, Any]) -> list[str]:
    """Roles the log's ``sensor_config_version`` must record (logs.yaml ``sensor_configs``)."""
    configs = rules.get("sensor_configs") or {}
    return [str(role) for role in configs.get(metadata.get("sensor_config_version", ""), [])]


def check_simulated_sensors(
    builder: ProfileLogBuilder, log: DriveLog, rules: dict[str, Any], reasons: list[Reason]
) -> list[ClockSync]:
    """The rig of a simulated-layout log: calibration, LiDAR, transforms, clocks.

    The frames were rebuilt by the simulated reader; the sensors are checked through the
    simulated source profile with the same code as a real car's, so a fleet log and a ROS 2
    log are held to one standard.
    """
    first = log.frames[0] if log.frames else None
    shapes: dict[str, tuple[int, ...]] = {}
    if first is not None:
        shapes["front_camera"] = first.image.shape
        if first.rear_image is not None:
            shapes["rear_camera"] = first.rear_image.shape
    builder.summarize_frame_roles(shapes.get("front_camera"))
    builder.check_sensors(shapes)
    builder.check_required(required_sensor_roles(log.metadata, rules))
    reasons += [Reason(problem.code, problem.message) for problem in builder.problems]
    try:
        sync = clock_sync(builder.clock_offsets())
    except DriveLogError:  # an undecodable stamp: the reader has reported that message already
        return []
    reasons += check_clock_sync(sync, rules)
    return sync


def check_clock_sync(sync: list[ClockSync], rules: dict[str, Any]) -> list[Reason]:
    """One reason per sensor whose clock is off the camera's beyond logs.yaml ``time_sync``."""
    limits = rules.get("time_sync") or {}
    max_skew, max_drift = float(limits["max_skew_ms"]), float(limits["max_drift_ppm"])
    return [
        Reason(
            errors.CLOCK_SKEW,
            f"{entry.role} clock is {entry.skew_ms:+.1f} ms off the camera's (limit "
            f"{max_skew:g}) and drifts {entry.drift_ppm:+.0f} ppm (limit {max_drift:g}) "
            f"over {entry.samples} stamps",
        )
        for entry in sync
        if abs(entry.skew_ms) > max_skew or abs(entry.drift_ppm) > max_drift
    ]


def with_clock(sensors: list[Any], sync: list[ClockSync]) -> list[dict[str, Any]]:
    """Sensor rows for the report, each with its clock skew and drift where measured."""
    by_role = {entry.role: entry for entry in sync}
    rows = []
    for sensor in sensors:
        row = sensor.to_dict()
        if sensor.role in by_role:
            row["clock_skew_ms"] = by_role[sensor.role].skew_ms
            row["clock_drift_ppm"] = by_role[sensor.role].drift_ppm
        rows.append(row)
    return rows
