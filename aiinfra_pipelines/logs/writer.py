"""Encode a :class:`DriveLog` as an MCAP file that Foxglove Studio opens as-is.

Every channel of a frame is stamped with the frame's timestamp as MCAP log time, so the reader
(and Foxglove's timeline) can align them exactly. Chunks are compressed and carry CRCs; on top
of mcap's defaults the data-section CRC is enabled too, so a flipped byte in a chunk *header* or
in the metadata record is detected and not only one inside a chunk's payload.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import mcap_protobuf
import numpy as np
from foxglove_schemas_protobuf.LocationFix_pb2 import LocationFix
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage
from google.protobuf.message import Message
from mcap.well_known import MessageEncoding
from mcap.writer import LIBRARY_IDENTIFIER, CompressionType
from mcap.writer import Writer as McapWriter
from mcap_protobuf.schema import register_schema

from aiinfra_pipelines.logs import _config
from aiinfra_pipelines.logs.model import (
    TOPIC_CAMERA,
    TOPIC_CAN,
    TOPIC_GROUND_TRUTH,
    TOPIC_LOCATION,
    TOPIC_POSE,
    TOPIC_TRIGGERS,
    DriveLog,
    Frame,
)
from aiinfra_pipelines.logs.model import TriggerEvent as TriggerEventRecord
from aiinfra_pipelines.logs.schemas import (
    TOPIC_SCHEMAS,
    CanSignals,
    GroundTruth,
    TriggerEvent,
)

METADATA_NAME = "drive_log"
CAMERA_FRAME_ID = "camera_front"
GPS_FRAME_ID = "gps"
MAP_FRAME_ID = "map"
IMAGE_ENCODING = "rgb8"
_LIBRARY = f"{LIBRARY_IDENTIFIER} mcap-protobuf-support/{mcap_protobuf.__version__} aiinfra"
_COMPRESSION = {"zstd": CompressionType.ZSTD, "lz4": CompressionType.LZ4}

Destination = BinaryIO | str | os.PathLike[str]


class _ChannelWriter:
    """Protobuf-on-MCAP writing as ``mcap_protobuf.writer.Writer`` does it, plus data CRCs.

    ``mcap_protobuf``'s writer cannot enable the data-section CRC, so this reuses its schema
    registration (the FileDescriptorSet Foxglove decodes) on a plain ``mcap`` writer.
    """

    def __init__(self, output: BinaryIO, compression: str, chunk_size: int) -> None:
        if compression not in _COMPRESSION:
            raise ValueError(f"compression must be one of {sorted(_COMPRESSION)}: {compression}")
        self._mcap = McapWriter(
            output,
            chunk_size=chunk_size,
            compression=_COMPRESSION[compression],
            enable_crcs=True,
            enable_data_crcs=True,
        )
        self._channels: dict[str, int] = {}
        self._mcap.start(profile="", library=_LIBRARY)

    def write(self, topic: str, message: Message, log_time: int) -> None:
        channel_id = self._channels.get(topic)
        if channel_id is None:
            schema_id = register_schema(self._mcap, type(message))
            channel_id = self._mcap.register_channel(
                topic=topic, message_encoding=MessageEncoding.Protobuf, schema_id=schema_id
            )
            self._channels[topic] = channel_id
        self._mcap.add_message(
            channel_id=channel_id,
            log_time=log_time,
            publish_time=log_time,
            data=message.SerializeToString(),
        )

    def add_metadata(self, name: str, data: dict[str, str]) -> None:
        self._mcap.add_metadata(name, data)

    def finish(self) -> None:
        self._mcap.finish()


def heading_to_quaternion(heading: float) -> tuple[float, float, float, float]:
    """Yaw about +z as ``(x, y, z, w)``; the reader inverts it, wrapping into (-pi, pi]."""
    return (0.0, 0.0, math.sin(heading / 2.0), math.cos(heading / 2.0))


def _camera_message(frame: Frame) -> RawImage:
    image = frame.image
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(
            f"frame {frame.timestamp_ns}: image must be HxWx3 uint8 (rgb8), "
            f"got shape {image.shape} dtype {image.dtype}"
        )
    height, width = int(image.shape[0]), int(image.shape[1])
    message = RawImage(
        frame_id=CAMERA_FRAME_ID,
        width=width,
        height=height,
        encoding=IMAGE_ENCODING,
        step=width * 3,
        data=np.ascontiguousarray(image).tobytes(),
    )
    message.timestamp.FromNanoseconds(frame.timestamp_ns)
    return message


def _location_message(frame: Frame) -> LocationFix:
    message = LocationFix(frame_id=GPS_FRAME_ID, latitude=frame.latitude, longitude=frame.longitude)
    message.timestamp.FromNanoseconds(frame.timestamp_ns)
    return message


def _pose_message(frame: Frame) -> PoseInFrame:
    message = PoseInFrame(frame_id=MAP_FRAME_ID)
    message.timestamp.FromNanoseconds(frame.timestamp_ns)
    message.pose.position.x = frame.x
    message.pose.position.y = frame.y
    qx, qy, qz, qw = heading_to_quaternion(frame.heading)
    orientation = message.pose.orientation
    orientation.x, orientation.y, orientation.z, orientation.w = qx, qy, qz, qw
    return message


def _can_message(frame: Frame) -> Message:
    message = CanSignals(
        speed_mps=frame.speed_mps,
        accel_mps2=frame.accel_mps2,
        steering_rad=frame.steering_rad,
        brake=frame.brake,
    )
    message.timestamp.FromNanoseconds(frame.timestamp_ns)
    return message


def _ground_truth_message(frame: Frame) -> Message:
    message = GroundTruth(lane_index=frame.lane_index, lane_count=frame.lane_count)
    message.timestamp.FromNanoseconds(frame.timestamp_ns)
    for other in frame.others:
        vehicle = message.vehicles.add(
            vehicle_id=other.vehicle_id,
            x=other.x,
            y=other.y,
            vx=other.vx,
            vy=other.vy,
            lane_offset=other.lane_offset,
            has_plate=other.plate_box is not None,
        )
        if other.plate_box is not None:
            x0, y0, x1, y1 = other.plate_box
            vehicle.plate_x0, vehicle.plate_y0, vehicle.plate_x1, vehicle.plate_y1 = (
                x0,
                y0,
                x1,
                y1,
            )
    return message


def _event_message(event: TriggerEventRecord) -> Message:
    message = TriggerEvent(rule=event.rule, value=event.value, threshold=event.threshold)
    message.timestamp.FromNanoseconds(event.timestamp_ns)
    return message


_FRAME_CHANNELS = (
    (TOPIC_CAMERA, _camera_message),
    (TOPIC_LOCATION, _location_message),
    (TOPIC_POSE, _pose_message),
    (TOPIC_CAN, _can_message),
    (TOPIC_GROUND_TRUTH, _ground_truth_message),
)


def _check_timestamp(timestamp_ns: int, what: str) -> None:
    # MCAP log times are uint64 nanoseconds; a negative or float time is a producer bug.
    if not isinstance(timestamp_ns, int | np.integer) or timestamp_ns < 0:
        raise ValueError(f"{what}: timestamp_ns must be a non-negative int, got {timestamp_ns!r}")


def _check_metadata(metadata: dict[str, str]) -> None:
    bad = {key: value for key, value in metadata.items() if not isinstance(value, str)}
    if bad or not all(isinstance(key, str) for key in metadata):
        raise ValueError(f"drive-log metadata keys and values must be str; offending: {bad}")


def _messages_in_time_order(
    log: DriveLog, omit: frozenset[str]
) -> Iterator[tuple[str, Message, int]]:
    """Frames in list order, each trigger right after the last frame at or before its time.

    Frames keep list order (not sorted) so that a producer bug such as time going backwards is
    preserved in the file for validation to see, rather than silently repaired here.
    """
    events = sorted(log.events, key=lambda event: event.timestamp_ns)
    next_event = 0
    for frame in log.frames:
        _check_timestamp(frame.timestamp_ns, "frame")
        while next_event < len(events) and events[next_event].timestamp_ns < frame.timestamp_ns:
            yield from _event(events[next_event], omit)
            next_event += 1
        for topic, build in _FRAME_CHANNELS:
            if topic not in omit:
                yield topic, build(frame), int(frame.timestamp_ns)
    for event in events[next_event:]:
        yield from _event(event, omit)


def _event(event: TriggerEventRecord, omit: frozenset[str]) -> Iterator[tuple[str, Message, int]]:
    _check_timestamp(event.timestamp_ns, f"trigger {event.rule}")
    if TOPIC_TRIGGERS not in omit:
        yield TOPIC_TRIGGERS, _event_message(event), int(event.timestamp_ns)


def _write_stream(
    log: DriveLog,
    output: BinaryIO,
    omit_topics: Iterable[str],
    compression: str | None,
    chunk_size: int | None,
) -> None:
    _check_metadata(log.metadata)
    omit = frozenset(omit_topics)
    unknown = omit - TOPIC_SCHEMAS.keys()
    if unknown:
        raise ValueError(f"omit_topics names unknown topics: {sorted(unknown)}")
    writer = _ChannelWriter(
        output,
        compression=compression or _config.setting("writer", "compression"),
        chunk_size=int(chunk_size or _config.setting("writer", "chunk_size_bytes")),
    )
    for topic, message, log_time in _messages_in_time_order(log, omit):
        writer.write(topic, message, log_time)
    writer.add_metadata(METADATA_NAME, dict(log.metadata))
    writer.finish()


def encode_drive_log(
    log: DriveLog,
    *,
    omit_topics: Iterable[str] = (),
    compression: str | None = None,
    chunk_size: int | None = None,
) -> bytes:
    """The MCAP bytes of ``log``; ``omit_topics`` drops channels (to build faulty test logs)."""
    buffer = io.BytesIO()
    _write_stream(log, buffer, omit_topics, compression, chunk_size)
    return buffer.getvalue()


def write_drive_log(
    log: DriveLog,
    destination: Destination,
    *,
    omit_topics: Iterable[str] = (),
    compression: str | None = None,
    chunk_size: int | None = None,
) -> None:
    """Write ``log`` to a binary stream or a path.

    A path is written to a temporary sibling and renamed into place, so a crash never leaves a
    half-written ``.mcap`` where an ingest sensor could pick it up.
    """
    if not isinstance(destination, str | os.PathLike):
        _write_stream(log, destination, omit_topics, compression, chunk_size)
        return
    target = Path(destination)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as output:
            _write_stream(log, output, omit_topics, compression, chunk_size)
        # mkstemp creates 0600; a drive log is data for the pipeline, not a secret.
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
