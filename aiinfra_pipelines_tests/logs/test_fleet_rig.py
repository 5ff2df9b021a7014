"""The simulated fleet records like a real car: JPEG front and rear cameras, a LiDAR, calibration
and static transforms in standard Foxglove schemas, validated with the real-car checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs._config import section
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.logs.model import (
    TOPIC_CAMERA,
    TOPIC_CAMERA_CALIBRATION,
    TOPIC_LIDAR,
    TOPIC_REAR_CAMERA,
    TOPIC_REAR_CAMERA_CALIBRATION,
    TOPIC_TF_STATIC,
)
from aiinfra_pipelines.logs.reader import read_drive_log, scan_mcap
from aiinfra_pipelines.logs.rig import Intrinsics
from aiinfra_pipelines.logs.sources.decode import MessageDecoder
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.writer import SENSOR_METADATA_NAME, encode_drive_log
from aiinfra_pipelines_tests.support.fleet_rig import healthy_logs, rig_drive, skewed_logs

pytestmark = pytest.mark.timeout(120)

RIG_SCHEMAS = {
    TOPIC_CAMERA: "foxglove.CompressedImage",
    TOPIC_REAR_CAMERA: "foxglove.CompressedImage",
    TOPIC_CAMERA_CALIBRATION: "foxglove.CameraCalibration",
    TOPIC_REAR_CAMERA_CALIBRATION: "foxglove.CameraCalibration",
    TOPIC_LIDAR: "foxglove.PointCloud",
    TOPIC_TF_STATIC: "foxglove.FrameTransforms",
}


def _decoded(data: bytes, topic: str) -> list:
    scanned = scan_mcap(data)
    decoder = MessageDecoder(scanned.schemas)
    channel = scanned.channel(topic)
    return [decoder.decode(channel, record) for record in scanned.messages[topic]]


def test_a_fleet_log_carries_two_jpeg_cameras_lidar_calibration_and_transforms() -> None:
    log = healthy_logs()[0]
    data = encode_drive_log(log)
    scanned = scan_mcap(data)
    for topic, schema in RIG_SCHEMAS.items():
        found = scanned.schema_for(topic)
        assert found is not None and found.name == schema and found.encoding == "protobuf"
        assert scanned.channel(topic).message_encoding == "protobuf"
    counts = scanned.message_counts()
    frames = len(log.frames)
    assert counts[TOPIC_CAMERA] == counts[TOPIC_REAR_CAMERA] == counts[TOPIC_LIDAR] == frames
    front, rear = log.frames[0].image, log.frames[0].rear_image
    for topic, image in ((TOPIC_CAMERA_CALIBRATION, front), (TOPIC_REAR_CAMERA_CALIBRATION, rear)):
        (calibration,) = _decoded(data, topic)
        assert (calibration.height, calibration.width) == image.shape[:2]
        assert np.isfinite(list(calibration.K)).all() and calibration.K[0] > 0
    (transforms,) = _decoded(data, TOPIC_TF_STATIC)
    children = {t.child_frame_id for t in transforms.transforms}
    assert children == {"camera_front", "camera_rear", "lidar"}
    assert {t.parent_frame_id for t in transforms.transforms} == {"base_link"}
    images = _decoded(data, TOPIC_CAMERA)
    assert {image.format for image in images} == {"jpeg"}
    stamps = [image.timestamp.ToNanoseconds() for image in images]
    assert stamps == [record.log_time for record in scanned.messages[TOPIC_CAMERA]]
    (sensor_record,) = [m for m in scanned.metadata if m.name == SENSOR_METADATA_NAME]
    version = log.metadata["sensor_config_version"]
    assert sensor_record.metadata["sensor_config_version"] == version
    assert version in section("validation")["sensor_configs"]
    assert sensor_record.metadata["cameras"] == "front,rear"

    report = validate_drive_log(data)
    assert report.accepted, report.reasons
    assert len(report.calibration_sha256) == 64
    sensors = {sensor["role"]: sensor for sensor in report.sensors}
    assert {"front_camera", "rear_camera", "lidar", "static_transforms"} <= set(sensors)
    assert sensors["rear_camera"]["width"] == rear.shape[1]
    assert sensors["lidar"]["clock_skew_ms"] == 0.0


def test_the_jpeg_front_camera_reaches_ingest_as_rgb8_of_the_same_size() -> None:
    log = healthy_logs("jpeg")[0]
    decoded = read_drive_log(encode_drive_log(log))
    for original, frame in zip(log.frames, decoded.frames, strict=True):
        assert frame.image.shape == original.image.shape and frame.image.dtype == np.uint8
        error = np.abs(frame.image.astype(int) - original.image.astype(int)).mean()
        assert error < 8.0  # quality 90: small, nonzero loss
        assert frame.rear_image.shape == original.rear_image.shape
        np.testing.assert_array_equal(frame.lidar_points, original.lidar_points)
    raw = healthy_logs("raw")[0]
    raw_data = encode_drive_log(raw)
    assert scan_mcap(raw_data).schema_for(TOPIC_CAMERA).name == "foxglove.RawImage"
    raw_decoded = read_drive_log(raw_data)
    for original, frame in zip(raw.frames, raw_decoded.frames, strict=True):
        np.testing.assert_array_equal(frame.image, original.image)
    # The encoding knob changes how frames are stored, never what the camera saw.
    for jpeg_frame, raw_frame in zip(log.frames, raw.frames, strict=True):
        np.testing.assert_array_equal(jpeg_frame.image, raw_frame.image)
    assert len(encode_drive_log(log)) < len(raw_data)


def test_a_calibration_that_does_not_match_the_images_is_refused() -> None:
    log = healthy_logs()[0]
    rear = log.recording.cameras["rear"]
    wrong = dataclasses.replace(rear.intrinsics, width=rear.intrinsics.width * 2)
    cameras = {**log.recording.cameras, "rear": dataclasses.replace(rear, intrinsics=wrong)}
    bad = dataclasses.replace(log, recording=dataclasses.replace(log.recording, cameras=cameras))
    report = validate_drive_log(encode_drive_log(bad))
    assert not report.accepted
    assert report.codes == [errors.BAD_CALIBRATION]
    assert "rear camera calibration" in report.reasons[0].message
    nan = dataclasses.replace(rear.intrinsics, k=(float("nan"),) * 9)
    assert isinstance(nan, Intrinsics)
    cameras = {**log.recording.cameras, "front": dataclasses.replace(rear, intrinsics=nan)}
    bad = dataclasses.replace(log, recording=dataclasses.replace(log.recording, cameras=cameras))
    assert errors.BAD_CALIBRATION in validate_drive_log(encode_drive_log(bad)).codes


def test_a_full_rig_car_without_its_rear_calibration_or_lidar_is_refused() -> None:
    log = healthy_logs()[0]
    missing = validate_drive_log(encode_drive_log(log, omit_topics=[TOPIC_REAR_CAMERA_CALIBRATION]))
    assert missing.codes == [errors.MISSING_CALIBRATION]
    no_lidar = validate_drive_log(encode_drive_log(log, omit_topics=[TOPIC_LIDAR]))
    assert no_lidar.codes == [errors.MISSING_CHANNEL] and "lidar" in no_lidar.reasons[0].message


def test_the_skewed_car_is_refused_with_the_measured_skew() -> None:
    (log, *_) = skewed_logs()
    report = validate_drive_log(encode_drive_log(log))
    assert report.codes == [errors.CLOCK_SKEW]
    assert "lidar clock is +120.0 ms" in report.reasons[0].message
    lidar = next(sensor for sensor in report.sensors if sensor["role"] == "lidar")
    assert lidar["clock_skew_ms"] == pytest.approx(120.0)


def test_anonymization_blurs_the_rear_camera_plates_too() -> None:
    boxed = [
        (log, i, other.rear_plate_box)
        for log in rig_drive()
        for i, frame in enumerate(log.frames)
        for other in frame.others
        if other.rear_plate_box is not None
    ]
    assert boxed, "the drive should put a car behind ego in the rear camera"
    anonymized = {id(log): anonymize_log(log, b"k" * 32) for log, _, _ in boxed}
    for log, i, (x0, y0, x1, y1) in boxed:
        region = anonymized[id(log)].frames[i].rear_image[y0:y1, x0:x1]
        assert (region == region.reshape(-1, 3)[0]).all()
