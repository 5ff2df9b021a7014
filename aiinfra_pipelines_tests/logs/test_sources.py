"""Real fleet recordings through source profiles: a ROS 2 car's log, and what it must refuse.

Every file here is written by the stock MCAP writers (``ros2_recording``), never ours.
"""

from __future__ import annotations

import numpy as np
import pytest

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.reader import read_drive_log
from aiinfra_pipelines.logs.sources import load_profiles, match_profile
from aiinfra_pipelines.logs.sources.profiles import parse_profile
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines_tests.support.ros2_recording import HEIGHT, WIDTH, write_ros2_recording


@pytest.fixture(scope="module")
def ros2_log() -> bytes:
    return write_ros2_recording()


def test_the_shipped_profiles_load_with_the_simulated_fleets_first() -> None:
    profiles = load_profiles()
    assert next(iter(profiles)) == "simulated"
    assert {"simulated", "ros2", "foxglove"} <= set(profiles)
    ros2 = profiles["ros2"]
    assert ros2.role("front_camera").topic == "/camera/front/image_raw/compressed"
    assert ros2.role("lidar").schema == "sensor_msgs/msg/PointCloud2"
    assert ros2.role("vehicle_status").encoding == "json"


def test_a_ros2_log_is_accepted_with_frames_rebuilt_from_its_own_sensor_rates(
    ros2_log: bytes,
) -> None:
    report = validate_drive_log(ros2_log)
    assert report.accepted, report.reasons
    assert report.profile == "ros2"
    assert report.frame_count == 20
    expected = make_synthetic_log(20, image_height=HEIGHT, image_width=WIDTH, plates_per_frame=0)
    log = report.log
    assert log is not None and log.metadata == expected.metadata
    first, original = log.frames[0], expected.frames[0]
    assert first.image.shape == (HEIGHT, WIDTH, 3)
    # JPEG at quality 90 smooths the synthetic frame's pixel noise but keeps its content.
    assert np.allclose(first.image.mean(axis=(0, 1)), original.image.mean(axis=(0, 1)), atol=2.0)
    # GNSS at 5 Hz: odd frames take the nearest fix, 100 ms earlier.
    assert log.frames[1].latitude == pytest.approx(expected.frames[0].latitude)
    assert log.frames[2].latitude == pytest.approx(expected.frames[2].latitude)
    assert first.heading == pytest.approx(original.heading, abs=1e-9)
    assert first.speed_mps == pytest.approx(original.speed_mps)
    assert [e.rule for e in log.events] == [e.rule for e in expected.events]
    sensors = {sensor["role"]: sensor for sensor in report.sensors}
    assert sensors["lidar"]["points_mean"] == 64.0
    assert sensors["gnss"]["rate_hz"] == pytest.approx(5.0)
    assert sensors["front_camera_calibration"]["width"] == WIDTH
    assert {"imu", "static_transforms", "events"} <= set(sensors)


def test_read_drive_log_reads_a_ros2_log_through_its_profile(ros2_log: bytes) -> None:
    log = read_drive_log(ros2_log)
    assert len(log.frames) == 20 and log.metadata["vin"]


def test_a_missing_calibration_is_refused_by_its_own_code() -> None:
    report = validate_drive_log(write_ros2_recording(calibration=False))
    assert not report.accepted
    assert errors.MISSING_CALIBRATION in report.codes
    assert "/camera/front/camera_info" in report.reasons[0].message


def test_a_calibration_for_another_image_size_is_refused() -> None:
    report = validate_drive_log(write_ros2_recording(calibration_width=64))
    assert errors.BAD_CALIBRATION in report.codes
    assert "calibrated for 64x48, images are 128x48" in " ".join(r.message for r in report.reasons)


def test_an_undecodable_jpeg_is_refused_naming_its_frame() -> None:
    report = validate_drive_log(write_ros2_recording(bad_jpeg_at=7))
    assert not report.accepted and report.log is None
    assert errors.BAD_IMAGE in report.codes
    assert str(1_717_228_800_000_000_000 + 7 * 100_000_000) in report.reasons[0].message


def test_a_point_cloud_with_the_wrong_field_layout_is_refused() -> None:
    report = validate_drive_log(write_ros2_recording(bad_cloud=True))
    assert report.codes == [errors.BAD_POINT_CLOUD]
    assert "x is datatype 8, not FLOAT32" in report.reasons[0].message


def test_a_topic_with_the_wrong_schema_is_refused_as_schema_drift() -> None:
    report = validate_drive_log(write_ros2_recording(gnss_schema="sensor_msgs/msg/Imu"))
    assert report.codes == [errors.WRONG_SCHEMA]
    assert "gnss (/gnss/fix carries cdr sensor_msgs/msg/Imu" in report.reasons[0].message


def test_an_unknown_layout_is_refused_naming_what_each_profile_misses() -> None:
    channels = {"/cam": ("cdr", "sensor_msgs/msg/Image")}
    with pytest.raises(errors.DriveLogError) as refused:
        match_profile(channels)
    assert refused.value.code == errors.UNKNOWN_SOURCE
    assert "ros2 lacks front_camera (looked at /camera/front/image_raw/compressed" in str(
        refused.value
    )
    assert "foxglove lacks" in str(refused.value)


def test_a_named_profile_must_fit_the_file(ros2_log: bytes) -> None:
    assert validate_drive_log(ros2_log, source="ros2").accepted
    report = validate_drive_log(ros2_log, source="foxglove")
    assert report.codes == [errors.UNKNOWN_SOURCE]
    assert validate_drive_log(ros2_log, source="nope").codes == [errors.UNKNOWN_SOURCE]


def test_a_simulated_fleet_log_still_reads_with_the_simulated_profile(encoded: bytes) -> None:
    report = validate_drive_log(encoded)
    assert report.accepted and report.profile == "simulated"


def test_a_profile_without_a_frame_role_or_with_an_unknown_encoding_is_refused() -> None:
    role = {"topic": "/t", "encoding": "cdr", "schema": "x"}
    frame_roles = {r: role for r in ("front_camera", "gnss", "pose")}
    with pytest.raises(ValueError, match="vehicle_status"):
        parse_profile({"name": "p", "roles": frame_roles})
    with pytest.raises(ValueError, match="encoding 'xml'"):
        parse_profile(
            {"name": "p", "roles": {**frame_roles, "vehicle_status": {**role, "encoding": "xml"}}}
        )


def test_sensor_clocks_are_measured_against_the_cameras(ros2_log: bytes) -> None:
    sensors = {sensor["role"]: sensor for sensor in validate_drive_log(ros2_log).sensors}
    assert sensors["front_camera"]["clock_skew_ms"] == 0.0
    # Odometry is logged 3 ms after it was stamped: transport latency, not a clock error.
    assert sensors["pose"]["clock_skew_ms"] == pytest.approx(-3.0)
    assert sensors["lidar"]["clock_drift_ppm"] == pytest.approx(0.0, abs=1.0)


def test_a_skewed_lidar_clock_is_refused_with_the_measured_skew() -> None:
    report = validate_drive_log(write_ros2_recording(lidar_clock_offset_ms=80.0))
    assert report.codes == [errors.CLOCK_SKEW]
    assert "lidar clock is +80.0 ms off the camera's (limit 20)" in report.reasons[0].message
    lidar = next(s for s in report.sensors if s["role"] == "lidar")
    assert lidar["clock_skew_ms"] == pytest.approx(80.0)


def test_a_drifting_lidar_clock_is_refused_with_the_measured_drift() -> None:
    # 5000 ppm over 2 s is 10 ms: the median skew stays inside the limit, the drift does not.
    report = validate_drive_log(write_ros2_recording(lidar_clock_drift_ppm=5000.0))
    assert report.codes == [errors.CLOCK_SKEW]
    assert "drifts +5000 ppm" in report.reasons[0].message


def test_a_foxglove_log_is_accepted_with_its_sensors() -> None:
    from aiinfra_pipelines_tests.support.foxglove_recording import write_foxglove_recording

    report = validate_drive_log(write_foxglove_recording())
    assert report.accepted, report.reasons
    assert report.profile == "foxglove" and report.frame_count == 20
    expected = make_synthetic_log(20, image_height=HEIGHT, image_width=WIDTH, plates_per_frame=0)
    assert report.log.frames[4].longitude == pytest.approx(expected.frames[4].longitude)
    assert report.log.frames[4].heading == pytest.approx(expected.frames[4].heading)
    sensors = {sensor["role"]: sensor for sensor in report.sensors}
    assert sensors["lidar"]["points_mean"] == 32.0
    assert sensors["front_camera_calibration"]["k"][0] == 100.0
    assert sensors["gnss"]["clock_skew_ms"] == 0.0


def test_conditions_a_real_log_lacks_are_derived_or_unknown_never_guessed() -> None:
    stated = make_synthetic_log(20, image_height=HEIGHT, image_width=WIDTH).metadata
    bare = {k: v for k, v in stated.items() if k not in ("lighting", "weather", "road_type")}
    report = validate_drive_log(write_ros2_recording(metadata=bare))
    assert report.accepted, report.reasons
    # 08:00 UTC on 1 June in Munich: the sun is well up.
    assert report.metadata["lighting"] == "day"
    assert report.metadata["weather"] == report.metadata["road_type"] == "unknown"
    assert report.log.metadata["weather"] == "unknown"
    assert "above the horizon" in report.derived_conditions["lighting"]
    assert set(report.derived_conditions) == {"lighting", "weather", "road_type"}
    # What a log states is kept as recorded.
    assert validate_drive_log(write_ros2_recording()).derived_conditions == {}


def test_lighting_follows_the_sun_at_the_logs_position() -> None:
    from datetime import UTC, datetime

    from aiinfra_pipelines.logs.sources.conditions import solar_elevation_deg

    munich = (48.14, 11.58)
    assert solar_elevation_deg(*munich, datetime(2024, 6, 21, 11, 20, tzinfo=UTC)) > 60.0
    assert solar_elevation_deg(*munich, datetime(2024, 6, 21, 23, 0, tzinfo=UTC)) < -10.0
    # Same instant, the other side of the planet: night in Munich is day in Sydney.
    assert solar_elevation_deg(-33.87, 151.21, datetime(2024, 6, 21, 2, 0, tzinfo=UTC)) > 20.0
