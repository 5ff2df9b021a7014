"""Encode a :class:`DriveLog` as an MCAP file that Foxglove Studio opens as-is.

Every channel of a frame is stamped with the frame's timestamp as MCAP log time, so the reader
(and Foxglove's timeline) can align them exactly. Chunks are compressed and carry CRCs; on top
of mcap's defaults the data-section CRC is enabled too, so a flipped byte in a chunk *header* or
in the metadata record is detected and not only one inside a chunk's payload.

This module decides which messages a file holds and in what order; each message itself is
built in :mod:`aiinfra_pipelines.logs.message_encode`.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import mcap_protobuf
import numpy as np
from google.protobuf.message import Message
from mcap.well_known import MessageEncoding
from mcap.writer import LIBRARY_IDENTIFIER, CompressionType
from mcap.writer import Writer as McapWriter
from mcap_protobuf.schema import register_schema

from aiinfra_pipelines.logs import _config
from aiinfra_pipelines.logs.message_encode import (
    calibration_message,
    camera_message,
    can_message,
    degradation_message,
    event_message,
    ground_truth_message,
    lidar_message,
    location_message,
    pose_message,
    rear_camera_message,
    transforms_message,
)
from aiinfra_pipelines.logs.model import (
    TOPIC_CAMERA,
    TOPIC_CAMERA_CALIBRATION,
    TOPIC_CAN,
    TOPIC_DEGRADATION,
    TOPIC_GROUND_TRUTH,
    TOPIC_LIDAR,
    TOPIC_LOCATION,
    TOPIC_POSE,
    TOPIC_REAR_CAMERA,
    TOPIC_REAR_CAMERA_CALIBRATION,
    TOPIC_TF_STATIC,
    TOPIC_TRIGGERS,
    DegradationEvent,
    DriveLog,
    Frame,
)
from aiinfra_pipelines.logs.model import TriggerEvent as TriggerEventRecord
from aiinfra_pipelines.logs.rig import Recording
from aiinfra_pipelines.logs.schemas import TOPIC_SCHEMAS

METADATA_NAME = "drive_log"
# A second metadata record, written with a recording rig: which sensors the car carried.
SENSOR_METADATA_NAME = "sensor_config"
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


_CALIBRATION_TOPICS = {"front": TOPIC_CAMERA_CALIBRATION, "rear": TOPIC_REAR_CAMERA_CALIBRATION}


def _rig_once(log: DriveLog, omit: frozenset[str]) -> Iterator[tuple[str, Message, int]]:
    """Calibration and static transforms, once at the log's start (latched, as ROS does)."""
    recording = log.recording
    if recording is None or not log.frames:
        return
    start = int(log.frames[0].timestamp_ns)
    has_rear = log.frames[0].rear_image is not None
    for name, camera in recording.cameras.items():
        topic = _CALIBRATION_TOPICS.get(name)
        if topic is None or topic in omit or (name == "rear" and not has_rear):
            continue
        yield topic, calibration_message(camera, start), start
    if recording.transforms and TOPIC_TF_STATIC not in omit:
        yield TOPIC_TF_STATIC, transforms_message(recording, start), start


def _rig_per_frame(
    frame: Frame, recording: Recording | None, omit: frozenset[str]
) -> Iterator[tuple[str, Message, int]]:
    if recording is None:
        return
    time = int(frame.timestamp_ns)
    if frame.rear_image is not None and TOPIC_REAR_CAMERA not in omit:
        yield TOPIC_REAR_CAMERA, rear_camera_message(frame, recording), time
    if frame.lidar_points is not None and TOPIC_LIDAR not in omit:
        yield TOPIC_LIDAR, lidar_message(frame, recording), time


_FRAME_CHANNELS = (
    (TOPIC_CAMERA, camera_message),
    (TOPIC_LOCATION, location_message),
    (TOPIC_POSE, pose_message),
    (TOPIC_CAN, can_message),
    (TOPIC_GROUND_TRUTH, ground_truth_message),
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
    """Frames in list order, each event (trigger or degradation transition) right after the
    last frame at or before its time.

    Frames keep list order (not sorted) so that a producer bug such as time going backwards is
    preserved in the file for validation to see, rather than silently repaired here.
    """
    events = sorted([*log.events, *log.degradation], key=lambda event: event.timestamp_ns)
    next_event = 0
    recording = log.recording
    yield from _rig_once(log, omit)
    for frame in log.frames:
        _check_timestamp(frame.timestamp_ns, "frame")
        while next_event < len(events) and events[next_event].timestamp_ns < frame.timestamp_ns:
            yield from _event(events[next_event], omit)
            next_event += 1
        for topic, build in _FRAME_CHANNELS:
            if topic not in omit:
                yield topic, build(frame, recording), int(frame.timestamp_ns)
        yield from _rig_per_frame(frame, recording, omit)
    for event in events[next_event:]:
        yield from _event(event, omit)


def _event(
    event: TriggerEventRecord | DegradationEvent, omit: frozenset[str]
) -> Iterator[tuple[str, Message, int]]:
    if isinstance(event, DegradationEvent):
        _check_timestamp(event.timestamp_ns, f"degradation {event.from_state}->{event.to_state}")
        if TOPIC_DEGRADATION not in omit:
            yield TOPIC_DEGRADATION, degradation_message(event), int(event.timestamp_ns)
        return
    _check_timestamp(event.timestamp_ns, f"trigger {event.rule}")
    if TOPIC_TRIGGERS not in omit:
        yield TOPIC_TRIGGERS, event_message(event), int(event.timestamp_ns)


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
    if log.recording is not None:
        writer.add_metadata(SENSOR_METADATA_NAME, _sensor_metadata(log))
    writer.finish()


def _sensor_metadata(log: DriveLog) -> dict[str, str]:
    """What the car says it carried (for people reading the file; ingest checks the messages)."""
    recording = log.recording
    assert recording is not None
    first = log.frames[0] if log.frames else None
    has_rear = first is not None and first.rear_image is not None
    cameras = [name for name in recording.cameras if name != "rear" or has_rear]
    return {
        "sensor_config_version": recording.sensor_config_version,
        "cameras": ",".join(cameras),
        "image_encoding": recording.image_encoding,
        "jpeg_quality": str(recording.jpeg_quality) if recording.image_encoding == "jpeg" else "",
        "lidar": "yes" if first is not None and first.lidar_points is not None else "no",
    }


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
