"""ROS 2 bags as recorded: the stock writer, no ``drive_log`` record, vehicle state in standard
messages (issue 39, point 6). What a bag lacks is unknown, reported, and never a refusal — except
the front camera, without which the loop has nothing to work with.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.ingest.tables import frames_table
from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.anonymize import anonymize_log, find_pii_leaks
from aiinfra_pipelines.logs.reader import read_drive_log
from aiinfra_pipelines.logs.sources.profiles import parse_profile
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines_tests.support.ros2_bags import (
    ACCEL_STEP,
    BRAKE_STEPS,
    LAYOUTS,
    synthetic_drive,
    write_ros2_bag,
)
from aiinfra_pipelines_tests.support.ros2_recording import write_ros2_recording

UNKNOWN = "unknown"


@pytest.fixture(scope="module")
def generic() -> bytes:
    return write_ros2_bag("generic")


@pytest.fixture(scope="module")
def autoware() -> bytes:
    return write_ros2_bag("autoware")


def _column(log, name: str) -> np.ndarray:
    return np.array([getattr(frame, name) for frame in log.frames])


def test_a_generic_bag_takes_speed_from_odometry_and_acceleration_from_the_imu(
    generic: bytes,
) -> None:
    report = validate_drive_log(generic)
    assert report.accepted, report.reasons
    assert report.profile == "ros2" and report.frame_count == 20
    assert report.signal_sources == {
        "latitude": "/gnss/fix latitude",
        "longitude": "/gnss/fix longitude",
        "x": "/odom x",
        "y": "/odom y",
        "heading": "/odom heading",
        "speed_mps": "/odom twist.twist.linear.x",
        "accel_mps2": "/imu/data linear_acceleration.x",
        "steering_rad": UNKNOWN,
        "brake": UNKNOWN,
    }
    drive, log = synthetic_drive(20), report.log
    assert np.allclose(_column(log, "speed_mps"), _column(drive, "speed_mps"))
    assert np.allclose(_column(log, "accel_mps2"), _column(drive, "accel_mps2"))
    assert np.allclose(_column(log, "heading"), _column(drive, "heading"))
    assert log.unknown_signals == {"steering_rad", "brake"}
    assert np.isnan(_column(log, "steering_rad")).all() and np.isnan(_column(log, "brake")).all()


def test_an_autoware_bag_reads_its_vehicle_reports_and_decodes_the_brake_off_the_can_bus(
    autoware: bytes,
) -> None:
    report = validate_drive_log(autoware)
    assert report.accepted, report.reasons
    sources = report.signal_sources
    assert sources["speed_mps"] == "/vehicle/status/velocity_status longitudinal_velocity"
    assert sources["steering_rad"] == "/vehicle/status/steering_status steering_tire_angle"
    assert sources["brake"] == "/from_can_bus CAN 0x1A0 brake"
    assert sources["accel_mps2"] == "/from_can_bus CAN 0xB0 accel_mps2"
    assert sources["x"] == "/localization/kinematic_state x"
    assert sources["latitude"] == sources["longitude"] == UNKNOWN  # no GNSS recorded
    drive, log = synthetic_drive(20), report.log
    # VelocityReport and SteeringReport carry float32; the CAN table's steps are the DBC's.
    assert np.allclose(_column(log, "speed_mps"), _column(drive, "speed_mps"), rtol=1e-6)
    assert np.allclose(_column(log, "steering_rad"), _column(drive, "steering_rad"), atol=1e-7)
    brake = _column(drive, "brake")
    assert brake.max() > 0.0
    assert np.allclose(_column(log, "brake"), brake, atol=0.5 / BRAKE_STEPS)
    assert np.allclose(_column(log, "accel_mps2"), _column(drive, "accel_mps2"), atol=ACCEL_STEP)
    assert log.unknown_signals == {"latitude", "longitude"}
    assert np.isnan(_column(log, "latitude")).all()
    # No fix to put the sun over: lighting comes from the images.
    assert "no fix" in report.derived_conditions["lighting"]
    roles = {sensor["role"]: sensor["topic"] for sensor in report.sensors}
    assert roles["front_camera"] == LAYOUTS["autoware"]["camera"]
    assert roles["front_camera_calibration"] == LAYOUTS["autoware"]["camera_info"]
    assert {"velocity_report", "steering_report", "can", "imu", "pose"} <= set(roles)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_metadata_no_recorder_writes_is_derived_or_unknown(layout: str) -> None:
    data = write_ros2_bag(layout)
    report = validate_drive_log(data)
    assert report.accepted, report.reasons
    metadata = report.metadata
    assert metadata["log_id"] == "ros2-" + hashlib.sha256(data).hexdigest()[:16]
    assert metadata["recorded_at"] == "2024-06-01T08:00:00+00:00"
    assert metadata["metadata_schema_version"] == "1"
    for key in ("vin", "vehicle_model", "software_version", "trigger_config_version", "city"):
        assert metadata[key] == UNKNOWN and report.derived_metadata[key] == UNKNOWN
    assert report.derived_metadata["log_id"] == "content_sha256"
    assert metadata["weather"] == metadata["road_type"] == UNKNOWN
    # read_drive_log (the PII audit's reader) sees the same derived identity.
    assert read_drive_log(data).metadata["log_id"] == metadata["log_id"]


def test_a_record_that_states_unknown_is_still_refused() -> None:
    stated = synthetic_drive(20).metadata
    report = validate_drive_log(write_ros2_recording(metadata={**stated, "vin": UNKNOWN}))
    assert "invalid_vin" in report.codes


def test_a_json_status_is_matched_by_its_keys_not_its_schema_name() -> None:
    data = write_ros2_recording(
        status_schema="acme.msg.CarState", status_keys=("speed_mps", "brake")
    )
    report = validate_drive_log(data)
    assert report.accepted, report.reasons
    sources = report.signal_sources
    assert sources["speed_mps"] == "/vehicle/status speed_mps"
    assert sources["brake"] == "/vehicle/status brake"
    assert sources["accel_mps2"] == "/imu/data linear_acceleration.x"  # the status lacks it
    assert sources["steering_rad"] == UNKNOWN
    drive = synthetic_drive(20)
    assert np.allclose(_column(report.log, "speed_mps"), _column(drive, "speed_mps"))


def test_a_bag_without_the_front_camera_is_refused_naming_the_role_and_topics() -> None:
    looked_at = (
        "front_camera (looked at /camera/front/image_raw/compressed, "
        "/sensing/camera/front/image_raw/compressed, "
        "/sensing/camera/camera0/image_rect_color/compressed)"
    )
    for source in (None, "ros2"):
        report = validate_drive_log(write_ros2_bag(camera=False), source=source)
        assert report.codes == [errors.UNKNOWN_SOURCE]
        assert looked_at in report.reasons[0].message


def test_a_nan_in_a_signal_the_bag_carries_is_still_refused() -> None:
    report = validate_drive_log(write_ros2_bag(nan_speed_at=5))
    assert report.codes == ["non_finite_signal"]
    assert "speed_mps is NaN/inf in 1 frame(s), first at index 5" in report.reasons[0].message


def test_an_unknown_vin_stays_unknown_through_anonymization(
    generic: bytes, anon_key: bytes
) -> None:
    raw = validate_drive_log(generic).log
    anonymous = anonymize_log(raw, anon_key)
    assert anonymous.metadata["vehicle_pseudonym"] == UNKNOWN
    assert "vin" not in anonymous.metadata
    assert anonymous.unknown_signals == raw.unknown_signals
    table = frames_table(anonymous)
    assert table["brake"].isna().all() and not table["speed_mps"].isna().any()
    coordinates = [(f.latitude, f.longitude) for f in raw.frames]
    assert find_pii_leaks(table, {raw.metadata["vin"]}, coordinates) == []
    # The search still finds a real VIN: the word "unknown" is just not one.
    leaked = pd.DataFrame({"note": ["WVWZZZ1JZXW000001"], "latitude": [math.nan]})
    assert find_pii_leaks(leaked, {"WVWZZZ1JZXW000001", UNKNOWN}, coordinates)


def test_a_profile_with_a_broken_signal_or_can_table_is_refused() -> None:
    camera = {"topic": "/c", "encoding": "cdr", "schema": "sensor_msgs/msg/CompressedImage"}
    roles = {r: camera for r in ("front_camera", "gnss", "pose")}
    roles["vehicle_status"] = {"topic": "/s", "encoding": "json"}
    base = {"name": "p", "roles": roles}
    assert parse_profile(base).role("vehicle_status").schemas == ()
    with pytest.raises(ValueError, match="unknown role"):
        parse_profile({**base, "signals": {"brake": [{"role": "nope", "field": "x"}]}})
    with pytest.raises(ValueError, match="no CAN entry"):
        parse_profile({**base, "signals": {"brake": [{"role": "gnss", "can": "brake"}]}})
    with pytest.raises(ValueError, match="byte_order"):
        table = {"brake": {"id": 1, "byte": 0, "length": 1, "byte_order": "middle"}}
        parse_profile({**base, "can": table})
    with pytest.raises(ValueError, match="lacks schema"):
        parse_profile({**base, "roles": {**roles, "gnss": {"topic": "/g", "encoding": "cdr"}}})
    with pytest.raises(ValueError, match="metadata log_id"):
        parse_profile({**base, "metadata": {"derived": {"log_id": "guess"}}})
