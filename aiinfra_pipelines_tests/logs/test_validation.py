"""Validation accepts a good log and names each planted fault with its reason code."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import pytest
from foxglove_schemas_protobuf.LocationFix_pb2 import LocationFix
from mcap_protobuf.writer import Writer as ProtobufWriter

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.logs.model import (
    OPTIONAL_METADATA_KEYS,
    REQUIRED_METADATA_KEYS,
    TOPIC_CAMERA,
    TOPIC_CAN,
    TOPIC_TRIGGERS,
    DriveLog,
)
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.validation_report import ValidationReport
from aiinfra_pipelines.logs.validation_rules import resolve_rules
from aiinfra_pipelines.logs.writer import encode_drive_log


def validate(log: DriveLog, **encode_options) -> ValidationReport:
    return validate_drive_log(encode_drive_log(log, **encode_options))


def messages_for(report: ValidationReport, code: str) -> list[str]:
    assert not report.accepted
    found = [reason.message for reason in report.reasons if reason.code == code]
    assert found, f"expected {code!r}, got {report.reasons}"
    return found


def test_synthetic_log_is_accepted(encoded: bytes) -> None:
    report = validate_drive_log(encoded)
    assert report.accepted, report.reasons
    assert report.reasons == []
    assert report.frame_count == 20
    assert report.frame_rate_hz == pytest.approx(10.0)
    assert report.duration_s == pytest.approx(1.9)
    assert report.log is not None and len(report.log.frames) == 20
    assert set(report.metadata) == {*REQUIRED_METADATA_KEYS, *OPTIONAL_METADATA_KEYS}
    assert report.metadata["anonymizer_version"].startswith("vehicle-anon-")
    assert report.pii_findings == []
    assert report.to_dict()["accepted"] is True


def test_logs_yaml_holds_the_documented_thresholds() -> None:
    rules = load_resource_yaml("logs.yaml")["validation"]
    assert rules["ranges"]["speed_mps"] == {"min": 0.0, "max": 70.0}
    assert rules["ranges"]["accel_mps2"] == {"min": -15.0, "max": 15.0}
    assert rules["ranges"]["steering_rad"] == {"min": -1.0, "max": 1.0}
    assert rules["ranges"]["brake"] == {"min": 0.0, "max": 1.0}
    for seed in range(5):  # the synthetic generator stays inside the contract
        assert validate(make_synthetic_log(seed=seed)).accepted


def test_missing_can_channel(log: DriveLog) -> None:
    report = validate(log, omit_topics=[TOPIC_CAN])
    assert any(TOPIC_CAN in m for m in messages_for(report, "missing_channel"))
    assert report.log is None
    assert report.frame_count == 20  # still measured from the camera channel


def test_log_without_trigger_events_misses_the_trigger_channel(log: DriveLog) -> None:
    log.events = []
    assert any(TOPIC_TRIGGERS in m for m in messages_for(validate(log), "missing_channel"))


def test_wrong_schema_on_a_known_topic() -> None:
    buffer = io.BytesIO()
    with ProtobufWriter(buffer) as writer:
        writer.write_message(TOPIC_CAN, LocationFix(latitude=1.0), log_time=1, publish_time=1)
    report = validate_drive_log(buffer.getvalue())
    [message] = messages_for(report, "wrong_schema")
    assert "aiinfra.CanSignals" in message and "foxglove.LocationFix" in message
    assert "missing_metadata" in report.codes
    assert any(TOPIC_CAMERA in m for m in messages_for(report, "missing_channel"))


def _set(attribute: str, index: int, value: float) -> Callable[[DriveLog], None]:
    def plant(log: DriveLog) -> None:
        setattr(log.frames[index], attribute, value)

    return plant


@pytest.mark.parametrize(
    ("plant", "code", "named"),
    [
        (_set("speed_mps", 4, float("nan")), "non_finite_signal", "speed_mps"),
        (_set("accel_mps2", 2, float("inf")), "non_finite_signal", "accel_mps2"),
        (_set("latitude", 2, float("-inf")), "non_finite_signal", "latitude"),
        (_set("speed_mps", 9, 71.0), "signal_out_of_range", "speed_mps"),
        (_set("speed_mps", 9, -0.5), "signal_out_of_range", "speed_mps"),
        (_set("accel_mps2", 3, -15.5), "signal_out_of_range", "accel_mps2"),
        (_set("steering_rad", 3, 1.2), "signal_out_of_range", "steering_rad"),
        (_set("brake", 3, 1.5), "signal_out_of_range", "brake"),
        (_set("latitude", 1, 91.0), "signal_out_of_range", "latitude"),
        (_set("longitude", 1, -181.0), "signal_out_of_range", "longitude"),
    ],
)
def test_bad_signal_is_named(log: DriveLog, plant, code: str, named: str) -> None:
    plant(log)
    report = validate(log)
    assert any(named in message for message in messages_for(report, code))
    assert report.log is not None  # readable, just not acceptable


def test_boundary_values_are_accepted(log: DriveLog) -> None:
    log.frames[1].speed_mps, log.frames[2].brake, log.frames[3].accel_mps2 = 70.0, 1.0, -15.0
    assert validate(log).accepted


def test_non_monotonic_timestamps(log: DriveLog) -> None:
    log.frames[5].timestamp_ns, log.frames[6].timestamp_ns = (
        log.frames[6].timestamp_ns,
        log.frames[5].timestamp_ns,
    )
    [message] = messages_for(validate(log), "non_monotonic_time")
    assert "index 6" in message


def test_duplicate_timestamp_is_not_strictly_monotonic(log: DriveLog) -> None:
    log.frames[8].timestamp_ns = log.frames[7].timestamp_ns
    assert messages_for(validate(log), "non_monotonic_time")


def test_frame_rate_too_low() -> None:
    too_slow = resolve_rules()["frame_rate_hz"]["min"] / 2
    report = validate(make_synthetic_log(frame_rate_hz=too_slow))
    [message] = messages_for(report, "frame_rate_out_of_range")
    assert f"{too_slow:.2f} Hz" in message
    assert report.frame_rate_hz == pytest.approx(too_slow)


def test_frame_rate_too_high() -> None:
    assert messages_for(
        validate(make_synthetic_log(frame_rate_hz=100.0)), "frame_rate_out_of_range"
    )


def test_gap_between_frames(log: DriveLog) -> None:
    for frame in log.frames[10:]:
        frame.timestamp_ns += 1_000_000_000
    report = validate(log)
    assert "1.100 s" in messages_for(report, "time_gap")[0]
    assert report.codes == ["time_gap"]  # 6.6 Hz on average is still an allowed rate


def test_too_few_frames() -> None:
    too_few = resolve_rules()["min_frames"] - 1
    report = validate(make_synthetic_log(n_frames=too_few))
    assert f"{too_few} frames" in messages_for(report, "too_few_frames")[0]


def test_rules_override_one_threshold_and_keep_the_rest(encoded: bytes) -> None:
    report = validate_drive_log(encoded, rules={"ranges": {"speed_mps": {"max": 5.0}}})
    assert messages_for(report, "signal_out_of_range")
    assert report.codes == ["signal_out_of_range"]  # the other ranges still come from YAML


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"city": None}, "missing keys ['city']"),
        ({"vin": None, "recorded_at": None}, "'vin'"),
    ],
)
def test_schema_drift_missing_key(change: dict, named: str) -> None:
    [message] = messages_for(validate(make_synthetic_log(**change)), "schema_drift")
    assert named in message


def test_schema_drift_unexpected_key(log: DriveLog) -> None:
    log.metadata["driver_name"] = "alice"
    [message] = messages_for(validate(log), "schema_drift")
    assert "unexpected keys ['driver_name']" in message


def test_schema_drift_bumped_version() -> None:
    [message] = messages_for(
        validate(make_synthetic_log(metadata_schema_version="2")), "schema_drift"
    )
    assert "'2'" in message and "'1'" in message


@pytest.mark.parametrize(
    ("key", "value"), [("weather", "snow"), ("lighting", "twilight"), ("road_type", "dirt")]
)
def test_unknown_category(key: str, value: str) -> None:
    [message] = messages_for(validate(make_synthetic_log(**{key: value})), "invalid_category")
    assert f"{key}={value!r}" in message


@pytest.mark.parametrize("value", ["yesterday", "2024-13-01T00:00:00Z", "2024-06-01T08:00:00"])
def test_recorded_at_must_be_iso_8601_with_offset(value: str) -> None:
    assert messages_for(validate(make_synthetic_log(recorded_at=value)), "invalid_recorded_at")


def test_vin_format_is_checked() -> None:
    assert messages_for(validate(make_synthetic_log(vin="NOT-A-VIN")), "invalid_vin")


def test_empty_metadata_value() -> None:
    [message] = messages_for(validate(make_synthetic_log(log_id="")), "empty_metadata_value")
    assert "log_id" in message


def test_empty_image(log: DriveLog) -> None:
    log.frames[4].image = np.zeros((0, 128, 3), dtype=np.uint8)
    assert "index 4" in messages_for(validate(log), "empty_image")[0]


def test_inconsistent_image_dims(log: DriveLog) -> None:
    log.frames[4].image = np.zeros((24, 64, 3), dtype=np.uint8)
    [message] = messages_for(validate(log), "inconsistent_image_dims")
    assert "(24, 64, 3)" in message and "(48, 128, 3)" in message


def test_trigger_outside_the_log(log: DriveLog) -> None:
    event = log.events[0]
    log.events = [type(event)(log.frames[-1].timestamp_ns + 10**9, "hard_brake", -6.0, -4.0)]
    assert "hard_brake" in messages_for(validate(log), "event_outside_log")[0]


def test_independent_faults_are_all_reported() -> None:
    log = make_synthetic_log(weather="snow", city=None)
    log.frames[3].speed_mps = float("nan")
    report = validate(log)
    assert {"invalid_category", "schema_drift", "non_finite_signal"} <= set(report.codes)
