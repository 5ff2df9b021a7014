"""Writer and reader: lossless round trip, and files that Foxglove can decode on their own."""

from __future__ import annotations

import io
import math
import stat

import numpy as np
import pytest
from foxglove_schemas_protobuf.LocationFix_pb2 import LocationFix
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor_pb2 import FileDescriptorSet
from mcap.reader import make_reader
from mcap_protobuf.decoder import DecoderFactory
from mcap_protobuf.writer import Writer as ProtobufWriter

from aiinfra_pipelines.logs import schemas
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.model import (
    REQUIRED_TOPICS,
    TOPIC_CAMERA,
    TOPIC_CAN,
    TOPIC_GROUND_TRUTH,
    TOPIC_LOCATION,
    TOPIC_POSE,
    TOPIC_TRIGGERS,
    DriveLog,
)
from aiinfra_pipelines.logs.reader import (
    iter_frames,
    read_drive_log,
    read_metadata,
    summarize_channels,
)
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.writer import encode_drive_log, write_drive_log

EXPECTED_SCHEMAS = {
    TOPIC_CAMERA: "foxglove.RawImage",
    TOPIC_LOCATION: "foxglove.LocationFix",
    TOPIC_POSE: "foxglove.PoseInFrame",
    TOPIC_CAN: "aiinfra.CanSignals",
    TOPIC_TRIGGERS: "aiinfra.TriggerEvent",
    TOPIC_GROUND_TRUTH: "aiinfra.GroundTruth",
}


def assert_logs_equal(expected: DriveLog, actual: DriveLog) -> None:
    assert actual.metadata == expected.metadata
    assert actual.events == expected.events
    assert len(actual.frames) == len(expected.frames)
    for want, got in zip(expected.frames, actual.frames, strict=True):
        assert got.image.dtype == np.uint8
        assert got.image.tobytes() == want.image.tobytes()
        assert got.image.shape == want.image.shape
        for name in ("timestamp_ns", "latitude", "longitude", "x", "y", "speed_mps"):
            assert getattr(got, name) == getattr(want, name), name
        for name in ("accel_mps2", "steering_rad", "brake", "lane_index", "lane_count"):
            assert getattr(got, name) == getattr(want, name), name
        assert got.others == want.others
        assert got.heading == pytest.approx(want.heading, abs=1e-12)


def test_round_trip_is_lossless(log: DriveLog) -> None:
    assert_logs_equal(log, read_drive_log(encode_drive_log(log)))


def test_round_trip_through_a_path_and_a_stream(log: DriveLog, tmp_path) -> None:
    path = tmp_path / "nested" / "drive.mcap"
    write_drive_log(log, path)
    assert_logs_equal(log, read_drive_log(path))
    assert_logs_equal(log, read_drive_log(str(path)))
    with open(path, "rb") as handle:
        assert_logs_equal(log, read_drive_log(handle))
    buffer = io.BytesIO()
    write_drive_log(log, buffer)
    assert buffer.getvalue() == path.read_bytes()  # deterministic bytes for identical logs


def test_path_write_leaves_no_temporary_file_and_is_world_readable(log: DriveLog, tmp_path):
    write_drive_log(log, tmp_path / "a.mcap")
    assert [p.name for p in tmp_path.iterdir()] == ["a.mcap"]
    assert stat.S_IMODE((tmp_path / "a.mcap").stat().st_mode) == 0o644


def test_non_seekable_stream_is_readable(encoded: bytes) -> None:
    class Pipe(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._inner = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def seekable(self) -> bool:
            return False

        def readinto(self, buffer) -> int:
            chunk = self._inner.read(len(buffer))
            buffer[: len(chunk)] = chunk
            return len(chunk)

    assert len(read_drive_log(Pipe(encoded)).frames) == 20


def test_lz4_compression_round_trips(log: DriveLog) -> None:
    data = encode_drive_log(log, compression="lz4")
    chunks = make_reader(io.BytesIO(data)).get_summary().chunk_indexes
    assert {chunk.compression for chunk in chunks} == {"lz4"}
    assert_logs_equal(log, read_drive_log(data))


def test_small_chunks_split_the_log_and_still_round_trip(log: DriveLog) -> None:
    data = encode_drive_log(log, chunk_size=32 * 1024)
    assert len(make_reader(io.BytesIO(data)).get_summary().chunk_indexes) > 5
    assert_logs_equal(log, read_drive_log(data))


def test_heading_is_wrapped_into_minus_pi_to_pi(log: DriveLog) -> None:
    log.frames[0].heading = 4.0
    heading = read_drive_log(encode_drive_log(log)).frames[0].heading
    assert heading == pytest.approx(4.0 - 2 * math.pi)


def test_file_uses_foxglove_schemas_with_protobuf_encoding(encoded: bytes) -> None:
    reader = make_reader(io.BytesIO(encoded))
    summary = reader.get_summary()
    by_topic = {c.topic: (summary.schemas[c.schema_id], c) for c in summary.channels.values()}
    assert {topic: s.name for topic, (s, _) in by_topic.items()} == EXPECTED_SCHEMAS
    assert {s.encoding for s, _ in by_topic.values()} == {"protobuf"}
    assert {c.message_encoding for _, c in by_topic.values()} == {"protobuf"}
    assert {chunk.compression for chunk in summary.chunk_indexes} <= {"zstd", "lz4"}
    assert all(chunk.compression for chunk in summary.chunk_indexes)


def test_embedded_schemas_decode_without_our_code(encoded: bytes) -> None:
    """What Foxglove does: build types from the FileDescriptorSet in each schema record."""
    reader = make_reader(io.BytesIO(encoded), decoder_factories=[DecoderFactory()])
    seen: dict[str, object] = {}
    for _schema, channel, _message, decoded in reader.iter_decoded_messages():
        seen.setdefault(channel.topic, decoded)
    assert seen[TOPIC_CAMERA].encoding == "rgb8"
    assert seen[TOPIC_CAMERA].step == seen[TOPIC_CAMERA].width * 3
    assert seen[TOPIC_CAMERA].frame_id == "camera_front"
    assert seen[TOPIC_LOCATION].frame_id == "gps"
    assert seen[TOPIC_POSE].frame_id == "map"
    assert seen[TOPIC_CAN].speed_mps > 0
    assert seen[TOPIC_TRIGGERS].rule == "hard_brake"
    assert len(seen[TOPIC_GROUND_TRUTH].vehicles) == 3
    assert (
        seen[TOPIC_CAN].timestamp.ToNanoseconds()
        == make_reader(io.BytesIO(encoded)).get_summary().statistics.message_start_time
    )


def test_custom_schema_descriptor_set_resolves_timestamp_dependency(encoded: bytes) -> None:
    summary = make_reader(io.BytesIO(encoded)).get_summary()
    schema = next(s for s in summary.schemas.values() if s.name == "aiinfra.GroundTruth")
    files = FileDescriptorSet.FromString(schema.data).file
    assert [f.name for f in files] == ["google/protobuf/timestamp.proto", "aiinfra/drive.proto"]
    pool = descriptor_pool.DescriptorPool()  # a fresh pool, as a viewer would use
    for file in files:
        pool.Add(file)
    vehicle = pool.FindMessageTypeByName("aiinfra.GroundTruthVehicle")
    assert [f.name for f in vehicle.fields] == [
        "vehicle_id", "x", "y", "vx", "vy", "lane_offset", "has_plate",
        "plate_x0", "plate_y0", "plate_x1", "plate_y1",
        "has_rear_plate", "rear_plate_x0", "rear_plate_y0", "rear_plate_x1", "rear_plate_y1",
    ]  # fmt: skip
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("aiinfra.CanSignals"))
    assert cls.DESCRIPTOR.fields_by_name["timestamp"].message_type.full_name == (
        "google.protobuf.Timestamp"
    )


def test_custom_messages_work_with_mcap_protobuf_writer() -> None:
    buffer = io.BytesIO()
    with ProtobufWriter(buffer) as writer:
        message = schemas.CanSignals(speed_mps=12.5, brake=0.25)
        message.timestamp.FromNanoseconds(5)
        writer.write_message("/vehicle/can", message, log_time=5, publish_time=5)
    buffer.seek(0)
    reader = make_reader(buffer, decoder_factories=[DecoderFactory()])
    [(_s, _c, _m, decoded)] = list(reader.iter_decoded_messages())
    assert (decoded.speed_mps, decoded.brake, decoded.timestamp.nanos) == (12.5, 0.25, 5)


def test_metadata_record_and_channel_summary(log: DriveLog, encoded: bytes) -> None:
    assert read_metadata(encoded) == log.metadata
    counts = summarize_channels(encoded)
    assert counts == {
        TOPIC_CAMERA: 20,
        TOPIC_LOCATION: 20,
        TOPIC_POSE: 20,
        TOPIC_CAN: 20,
        TOPIC_GROUND_TRUTH: 20,
        TOPIC_TRIGGERS: 1,
    }
    assert set(REQUIRED_TOPICS) <= counts.keys()


def test_iter_frames_streams_the_same_frames(log: DriveLog, encoded: bytes) -> None:
    streamed = list(iter_frames(encoded))
    assert_logs_equal(log, DriveLog(metadata=log.metadata, frames=streamed, events=log.events))


def test_omit_topics_drops_exactly_that_channel(log: DriveLog) -> None:
    counts = summarize_channels(encode_drive_log(log, omit_topics=[TOPIC_CAN]))
    assert TOPIC_CAN not in counts
    assert counts[TOPIC_CAMERA] == 20


def test_writer_rejects_producer_bugs(log: DriveLog) -> None:
    with pytest.raises(ValueError, match="omit_topics"):
        encode_drive_log(log, omit_topics=["/no/such/topic"])
    bad_meta = DriveLog(metadata={"log_id": 7}, frames=log.frames)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="must be str"):
        encode_drive_log(bad_meta)
    log.frames[0].image = log.frames[0].image[..., 0]
    with pytest.raises(ValueError, match="HxWx3"):
        encode_drive_log(log)


def test_logs_without_ground_truth_read_with_empty_truth(log: DriveLog) -> None:
    back = read_drive_log(encode_drive_log(log, omit_topics=[TOPIC_GROUND_TRUTH]))
    assert all(f.others == [] and f.lane_count == 0 for f in back.frames)
    assert back.frames[0].speed_mps == log.frames[0].speed_mps


def test_synthetic_log_is_deterministic_and_overridable() -> None:
    first, second = make_synthetic_log(seed=3), make_synthetic_log(seed=3)
    assert first.metadata == second.metadata
    assert first.frames[5].image.tobytes() == second.frames[5].image.tobytes()
    assert make_synthetic_log(seed=4).metadata["vin"] != first.metadata["vin"]
    assert make_synthetic_log(weather="fog").metadata["weather"] == "fog"
    assert "city" not in make_synthetic_log(city=None).metadata
    assert make_synthetic_log(image_height=24).frames[0].image.shape == (24, 128, 3)
    with pytest.raises(TypeError, match="unknown override"):
        make_synthetic_log(wheather="fog")


def _independently_sampled_log(can_offset_ns: int) -> bytes:
    """A real-fleet style file: CAN sampled on its own clock, offset from the camera."""
    buffer = io.BytesIO()
    with ProtobufWriter(buffer) as writer:
        for i in range(3):
            time = 1_000_000_000 + i * 100_000_000
            image = RawImage(width=2, height=1, step=6, encoding="rgb8", data=bytes(range(6)))
            location = LocationFix(latitude=48.0 + i, longitude=11.0)
            pose = PoseInFrame()
            pose.pose.orientation.w = 1.0
            for topic, message in (
                (TOPIC_CAMERA, image),
                (TOPIC_LOCATION, location),
                (TOPIC_POSE, pose),
            ):
                writer.write_message(topic, message, log_time=time, publish_time=time)
            can = schemas.CanSignals(speed_mps=float(i))
            writer.write_message(TOPIC_CAN, can, log_time=time + can_offset_ns, publish_time=time)
        writer.add_metadata("drive_log", {"log_id": "fleet"})
    return buffer.getvalue()


def test_independent_channels_align_to_the_nearest_sample_within_tolerance() -> None:
    log = read_drive_log(_independently_sampled_log(can_offset_ns=5_000_000))  # 5 ms late
    assert [f.speed_mps for f in log.frames] == [0.0, 1.0, 2.0]
    assert [f.latitude for f in log.frames] == [48.0, 49.0, 50.0]
    assert log.frames[0].image.tolist() == [[[0, 1, 2], [3, 4, 5]]]


def test_channel_far_from_the_camera_is_unaligned() -> None:
    with pytest.raises(DriveLogError) as raised:
        read_drive_log(_independently_sampled_log(can_offset_ns=50_000_000))  # beyond 20 ms
    assert raised.value.code == "unaligned_channel"
    assert TOPIC_CAN in raised.value.message
