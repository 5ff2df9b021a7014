"""Read MCAP drive logs back into :class:`DriveLog`, refusing damaged files with a reason code.

Integrity is checked before any content is trusted, in three layers, because mcap's readers
each cover only part of it: the envelope (leading magic, closing footer + magic, summary CRC,
which mcap does not check) catches truncation and cut uploads; a linear pass with
``validate_crcs=True`` checks every chunk CRC and the data-section CRC (which the seeking reader
skips); only then are messages decoded. Every failure becomes a :class:`DriveLogError` whose
``code`` is stable (see :mod:`aiinfra_pipelines.logs.errors`).

``read_drive_log`` keeps messages in *file* order, not log-time order, so a producer whose clock
went backwards is visible to validation instead of being silently re-sorted.
"""

from __future__ import annotations

import bisect
import io
import math
import os
import struct
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np
import zstandard
from google.protobuf.message import DecodeError, Message
from mcap.exceptions import EndOfFile, InvalidMagic, McapError, RecordLengthLimitExceeded
from mcap.reader import SeekingReader
from mcap.records import Channel, Header, Metadata, Schema
from mcap.records import Message as McapMessage
from mcap.stream_reader import CRCValidationError, StreamReader
from mcap.summary import Summary
from mcap.well_known import MessageEncoding, SchemaEncoding

from aiinfra_pipelines.logs import _config, errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.model import (
    SIMULATED_PROFILE,
    TOPIC_CAMERA,
    TOPIC_CAN,
    TOPIC_DEGRADATION,
    TOPIC_GROUND_TRUTH,
    TOPIC_LIDAR,
    TOPIC_LOCATION,
    TOPIC_POSE,
    TOPIC_REAR_CAMERA,
    TOPIC_TRIGGERS,
    DegradationEvent,
    DriveLog,
    Frame,
    OtherVehicle,
    TriggerEvent,
)
from aiinfra_pipelines.logs.schemas import TOPIC_SCHEMAS, accepted_schemas, message_class
from aiinfra_pipelines.logs.sources import decode as role_decode
from aiinfra_pipelines.logs.writer import IMAGE_ENCODING, METADATA_NAME

Source = bytes | bytearray | memoryview | BinaryIO | str | os.PathLike[str]

MAGIC = b"\x89MCAP0\r\n"
_FOOTER_RECORD_SIZE = 1 + 8 + 8 + 8 + 4  # opcode, length, summary_start, offset_start, crc
_FOOTER_OPCODE = 0x02
_CRC_BLOCK = 1 << 20
# Channels without which a frame cannot be rebuilt; ground truth is optional (real fleets).
FRAME_TOPICS: tuple[str, ...] = (TOPIC_CAMERA, TOPIC_LOCATION, TOPIC_POSE, TOPIC_CAN)


@dataclass
class ScannedLog:
    """Every record of an integrity-checked MCAP file, messages still undecoded, in file order."""

    header: Header | None = None
    schemas: dict[int, Schema] = field(default_factory=dict)
    channels: dict[int, Channel] = field(default_factory=dict)
    messages: dict[str, list[McapMessage]] = field(default_factory=lambda: defaultdict(list))
    metadata: list[Metadata] = field(default_factory=list)

    def message_counts(self) -> dict[str, int]:
        """Messages per topic, including registered channels that carry none."""
        counts = {channel.topic: 0 for channel in self.channels.values()}
        counts.update({topic: len(messages) for topic, messages in self.messages.items()})
        return counts

    def channel(self, topic: str) -> Channel | None:
        return next((c for c in self.channels.values() if c.topic == topic), None)

    def schema_for(self, topic: str) -> Schema | None:
        channel = self.channel(topic)
        return None if channel is None else self.schemas.get(channel.schema_id)

    def drive_log_metadata(self) -> list[dict[str, str]]:
        """All ``drive_log`` metadata records (a valid file has exactly one)."""
        return [dict(record.metadata) for record in self.metadata if record.name == METADATA_NAME]


# --------------------------------------------------------------------------- opening + errors


@contextmanager
def _open_source(source: Source) -> Iterator[BinaryIO]:
    """A seekable stream positioned at the file start, whatever the caller handed in."""
    if isinstance(source, bytes | bytearray | memoryview):
        yield io.BytesIO(bytes(source))
    elif isinstance(source, str | os.PathLike):
        try:
            handle = open(source, "rb")  # noqa: SIM115 - closed below, after the caller's use
        except OSError as exc:
            raise DriveLogError(errors.UNREADABLE, f"cannot open {source}: {exc}") from exc
        with handle:
            yield handle
    elif source.seekable() and source.tell() == 0:
        yield source
    else:
        # Offsets in MCAP are absolute; a pipe or a stream mid-way must be buffered first.
        yield io.BytesIO(source.read())


def _stream_size(stream: BinaryIO) -> int:
    size = stream.seek(0, io.SEEK_END)
    stream.seek(0)
    return size


@contextmanager
def _translate_errors() -> Iterator[None]:
    """Map the many exception types mcap, zstd and lz4 raise onto our reason codes."""
    try:
        yield
    except DriveLogError:
        raise
    except Exception as exc:
        code, message = _reason_for(exc)
        raise DriveLogError(code, message) from exc


def _lz4_or_unreadable(exc: BaseException) -> tuple[str, str]:
    if "LZ4" in str(exc).upper():
        return errors.CRC_MISMATCH, f"chunk payload is corrupted ({exc})"
    return errors.UNREADABLE, f"{type(exc).__name__}: {exc}"


# The first entry whose classes match decides, so subclasses stand before their bases.
_REASONS: tuple[tuple[type | tuple[type, ...], Callable[[BaseException], tuple[str, str]]], ...] = (
    (CRCValidationError, lambda exc: (errors.CRC_MISMATCH, str(exc))),
    # A flipped byte in a compressed chunk usually breaks decompression before the CRC of the
    # decompressed bytes can be compared; it is the same fault, so the same code.
    (
        zstandard.ZstdError,
        lambda exc: (errors.CRC_MISMATCH, f"chunk payload is corrupted (zstd: {exc})"),
    ),
    (InvalidMagic, lambda exc: (errors.NOT_MCAP, str(exc))),
    (
        (EndOfFile, struct.error),
        lambda _: (
            errors.CORRUPT,
            "a record extends past the end of the file (corrupt length field)",
        ),
    ),
    (RecordLengthLimitExceeded, lambda exc: (errors.CORRUPT, str(exc))),
    (UnicodeDecodeError, lambda exc: (errors.CORRUPT, f"record text is not UTF-8: {exc}")),
    (RuntimeError, _lz4_or_unreadable),
    (
        (McapError, ValueError, KeyError, IndexError),
        lambda exc: (errors.CORRUPT, f"{type(exc).__name__}: {exc}"),
    ),
)


def _reason_for(exc: BaseException) -> tuple[str, str]:
    """The reason code and message of a reader failure (UNREADABLE for anything unforeseen)."""
    for classes, reason in _REASONS:
        if isinstance(exc, classes):
            return reason(exc)
    return errors.UNREADABLE, f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- envelope


def _check_leading_magic(stream: BinaryIO, size: int) -> None:
    if size == 0:
        raise DriveLogError(errors.EMPTY, "the file is empty (0 bytes)")
    head = stream.read(len(MAGIC))
    if head != MAGIC:
        if len(head) < len(MAGIC) and MAGIC.startswith(head):
            raise DriveLogError(errors.TRUNCATED, f"file ends inside the MCAP magic ({size} B)")
        raise DriveLogError(errors.NOT_MCAP, "not an MCAP file (leading magic missing)")


def _read_footer(stream: BinaryIO, size: int) -> tuple[int, int]:
    """``(summary_start, summary_crc)``, or TRUNCATED when the file was never finished."""
    minimum = 2 * len(MAGIC) + _FOOTER_RECORD_SIZE
    stream.seek(max(size - len(MAGIC), 0))
    if size < minimum or stream.read(len(MAGIC)) != MAGIC:
        raise DriveLogError(
            errors.TRUNCATED,
            f"file ends without the closing MCAP magic after {size} B: the upload was cut "
            "or the writer never finished",
        )
    stream.seek(size - len(MAGIC) - _FOOTER_RECORD_SIZE)
    footer = stream.read(_FOOTER_RECORD_SIZE)
    opcode, length, summary_start, _offset_start, summary_crc = struct.unpack("<BQQQI", footer)
    if opcode != _FOOTER_OPCODE or length != _FOOTER_RECORD_SIZE - 9:
        raise DriveLogError(errors.TRUNCATED, "no footer record before the closing magic")
    if summary_start >= size:
        raise DriveLogError(errors.CORRUPT, f"footer points past the file end ({summary_start})")
    return summary_start, summary_crc


def _check_summary_crc(stream: BinaryIO, size: int, summary_start: int, expected: int) -> None:
    """mcap's Python readers ignore the footer's summary CRC; the chunk index lives there."""
    if expected == 0:
        return  # writer did not compute one
    start = summary_start or size - len(MAGIC) - _FOOTER_RECORD_SIZE
    end = size - len(MAGIC) - 4  # the CRC covers the footer up to, not including, itself
    stream.seek(start)
    crc, remaining = 0, end - start
    while remaining > 0:
        block = stream.read(min(_CRC_BLOCK, remaining))
        crc, remaining = zlib.crc32(block, crc), remaining - len(block)
    if crc != expected:
        raise DriveLogError(
            errors.CRC_MISMATCH,
            f"summary section CRC mismatch (expected {expected}, calculated {crc})",
        )


def _check_envelope(stream: BinaryIO) -> int:
    """Validate magic, footer and summary CRC; returns the file size."""
    size = _stream_size(stream)
    _check_leading_magic(stream, size)
    summary_start, summary_crc = _read_footer(stream, size)
    _check_summary_crc(stream, size, summary_start, summary_crc)
    stream.seek(0)
    return size


# --------------------------------------------------------------------------- scanning


def _collect(scanned: ScannedLog, record: Any) -> None:
    if isinstance(record, McapMessage):
        channel = scanned.channels.get(record.channel_id)
        if channel is None:
            raise DriveLogError(errors.CORRUPT, f"message on unknown channel {record.channel_id}")
        scanned.messages[channel.topic].append(record)
    elif isinstance(record, Channel):
        scanned.channels[record.id] = record
    elif isinstance(record, Schema):
        scanned.schemas[record.id] = record
    elif isinstance(record, Metadata):
        scanned.metadata.append(record)
    elif isinstance(record, Header):
        scanned.header = record


def _scan_stream(stream: BinaryIO) -> ScannedLog:
    with _translate_errors():
        size = _check_envelope(stream)
        scanned = ScannedLog()
        reader = StreamReader(stream, validate_crcs=True, record_size_limit=size)
        for record in reader.records:
            _collect(scanned, record)
    return scanned


def scan_mcap(source: Source) -> ScannedLog:
    """Read and integrity-check every record; raises :class:`DriveLogError` on damage."""
    with _open_source(source) as stream:
        return _scan_stream(stream)


# --------------------------------------------------------------------------- decoding


def _check_schema(topic: str, channel: Channel, schema: Schema | None) -> None:
    accepted = accepted_schemas(topic)
    expected = " or ".join(accepted)
    if (
        schema is None
        or schema.name not in accepted
        or schema.encoding != SchemaEncoding.Protobuf
        or channel.message_encoding != MessageEncoding.Protobuf
    ):
        found = "no schema" if schema is None else f"{schema.name} ({schema.encoding})"
        raise DriveLogError(
            errors.WRONG_SCHEMA, f"{topic} must carry protobuf {expected}, found {found}"
        )


def check_schemas(channels: dict[int, Channel], schemas: dict[int, Schema]) -> list[DriveLogError]:
    """One error per known topic whose schema or encoding is not the one we write."""
    problems = []
    for channel in channels.values():
        if channel.topic not in TOPIC_SCHEMAS:
            continue  # extra channels (e.g. a second camera) are allowed and ignored
        try:
            _check_schema(channel.topic, channel, schemas.get(channel.schema_id))
        except DriveLogError as exc:
            problems.append(exc)
    return problems


def _decode(topic: str, record: McapMessage, schema_name: str | None = None) -> Message:
    try:
        return message_class(topic, schema_name).FromString(record.data)
    except DecodeError as exc:
        raise DriveLogError(
            errors.DECODE_ERROR, f"{topic} message at {record.log_time} is not valid: {exc}"
        ) from exc


def _decode_image(message: Any, timestamp_ns: int) -> np.ndarray:
    if message.DESCRIPTOR.name == "CompressedImage":  # fleet-7: JPEG, decoded to rgb8 here
        return role_decode.image_rgb(message, f"frame {timestamp_ns}")
    height, width, step = int(message.height), int(message.width), int(message.step)
    row_bytes = width * 3
    if message.encoding != IMAGE_ENCODING:
        raise DriveLogError(
            errors.BAD_IMAGE, f"frame {timestamp_ns}: encoding {message.encoding!r} is not rgb8"
        )
    if height == 0 or width == 0:
        return np.zeros((height, width, 3), dtype=np.uint8)
    if step < row_bytes or len(message.data) < height * step:
        raise DriveLogError(
            errors.BAD_IMAGE,
            f"frame {timestamp_ns}: {len(message.data)} B cannot hold {height}x{width} rgb8 "
            f"with step {step}",
        )
    rows = np.frombuffer(message.data, dtype=np.uint8, count=height * step).reshape(height, step)
    return rows[:, :row_bytes].reshape(height, width, 3).copy()


def quaternion_to_heading(x: float, y: float, z: float, w: float) -> float:
    """Yaw of a quaternion in (-pi, pi]; the inverse of the writer's heading encoding."""
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def _others(ground_truth: Any | None) -> list[OtherVehicle]:
    if ground_truth is None:
        return []
    return [
        OtherVehicle(
            vehicle_id=v.vehicle_id,
            x=v.x,
            y=v.y,
            vx=v.vx,
            vy=v.vy,
            lane_offset=v.lane_offset,
            plate_box=(v.plate_x0, v.plate_y0, v.plate_x1, v.plate_y1) if v.has_plate else None,
            rear_plate_box=(v.rear_plate_x0, v.rear_plate_y0, v.rear_plate_x1, v.rear_plate_y1)
            if v.has_rear_plate
            else None,
        )
        for v in ground_truth.vehicles
    ]


def _frame(
    timestamp_ns: int,
    camera: Any,
    location: Any,
    pose: Any,
    can: Any,
    ground_truth: Any | None,
    rear_camera: Any | None = None,
    lidar: Any | None = None,
) -> Frame:
    orientation = pose.pose.orientation
    return Frame(
        timestamp_ns=timestamp_ns,
        image=_decode_image(camera, timestamp_ns),
        latitude=location.latitude,
        longitude=location.longitude,
        x=pose.pose.position.x,
        y=pose.pose.position.y,
        heading=quaternion_to_heading(orientation.x, orientation.y, orientation.z, orientation.w),
        speed_mps=can.speed_mps,
        accel_mps2=can.accel_mps2,
        steering_rad=can.steering_rad,
        brake=can.brake,
        lane_index=ground_truth.lane_index if ground_truth is not None else 0,
        lane_count=ground_truth.lane_count if ground_truth is not None else 0,
        others=_others(ground_truth),
        rear_image=None if rear_camera is None else _decode_image(rear_camera, timestamp_ns),
        lidar_points=None
        if lidar is None
        else role_decode.points_xyz(lidar, f"{TOPIC_LIDAR} at {timestamp_ns}"),
    )


def _event(record: McapMessage) -> TriggerEvent:
    message: Any = _decode(TOPIC_TRIGGERS, record)
    return TriggerEvent(
        timestamp_ns=record.log_time,
        rule=message.rule,
        value=message.value,
        threshold=message.threshold,
    )


def _degradation(record: McapMessage) -> DegradationEvent:
    message: Any = _decode(TOPIC_DEGRADATION, record)
    return DegradationEvent(
        timestamp_ns=record.log_time,
        from_state=message.from_state,
        to_state=message.to_state,
        cause=message.cause,
        detail=message.detail,
    )


# --------------------------------------------------------------------------- alignment


def align_records(
    camera_times: list[int], records: list[McapMessage], tolerance_ns: int
) -> list[McapMessage | None]:
    """The record of one channel that belongs to each camera frame (``None`` if none does).

    When the channel has exactly one record per frame at the same log times (what our writer
    produces) pairing is positional, which stays correct even for duplicated or backwards
    timestamps. Otherwise each frame takes the nearest record within ``tolerance_ns``.
    """
    if len(records) == len(camera_times) and all(
        record.log_time == time for record, time in zip(records, camera_times, strict=True)
    ):
        return list(records)
    ordered = sorted(records, key=lambda record: record.log_time)
    times = [record.log_time for record in ordered]
    aligned: list[McapMessage | None] = []
    for time in camera_times:
        index = bisect.bisect_left(times, time)
        candidates = [i for i in (index - 1, index) if 0 <= i < len(times)]
        best = min(candidates, key=lambda i: abs(times[i] - time), default=None)
        if best is not None and abs(times[best] - time) <= tolerance_ns:
            aligned.append(ordered[best])
        else:
            aligned.append(None)
    return aligned


def rate_hz(times_ns: Sequence[int] | np.ndarray) -> float | None:
    """Messages per second over log times in order; ``None`` for fewer than two or no span."""
    if len(times_ns) < 2 or times_ns[-1] <= times_ns[0]:
        return None
    return (len(times_ns) - 1) / ((times_ns[-1] - times_ns[0]) / 1e9)


def _tolerance_ns() -> int:
    return round(float(_config.setting("reader", "align_tolerance_s")) * 1e9)


def _require_frame_channels(
    counts: dict[str, int], channels: dict[int, Channel], schemas: dict[int, Schema]
) -> None:
    missing = [topic for topic in FRAME_TOPICS if counts.get(topic, 0) == 0]
    if missing:
        raise DriveLogError(
            errors.MISSING_CHANNEL, f"cannot rebuild frames without channel(s) {missing}"
        )
    for problem in check_schemas(channels, schemas):
        raise problem


def _schema_name(scanned: ScannedLog, topic: str) -> str | None:
    schema = scanned.schema_for(topic)
    return None if schema is None else schema.name


def _aligned_channel(
    scanned: ScannedLog, topic: str, camera_times: list[int], required: bool
) -> list[Any | None]:
    aligned = align_records(camera_times, scanned.messages.get(topic, []), _tolerance_ns())
    schema_name = _schema_name(scanned, topic)
    decoded = []
    for time, record in zip(camera_times, aligned, strict=True):
        if record is None and required:
            raise DriveLogError(
                errors.UNALIGNED_CHANNEL, f"{topic} has no message near camera frame {time}"
            )
        decoded.append(None if record is None else _decode(topic, record, schema_name))
    return decoded


def build_drive_log(scanned: ScannedLog, metadata: dict[str, str] | None = None) -> DriveLog:
    """Decode and align a scanned file into frames (file order) and trigger events."""
    _require_frame_channels(scanned.message_counts(), scanned.channels, scanned.schemas)
    camera_records = scanned.messages[TOPIC_CAMERA]
    camera_times = [record.log_time for record in camera_records]
    channels = {
        topic: _aligned_channel(scanned, topic, camera_times, required=True)
        for topic in (TOPIC_LOCATION, TOPIC_POSE, TOPIC_CAN)
    }
    # Optional: ground truth (simulation only), and the rig's rear camera and LiDAR (fleet-7).
    optional = {
        topic: _aligned_channel(scanned, topic, camera_times, required=False)
        if scanned.messages.get(topic)
        else [None] * len(camera_times)
        for topic in (TOPIC_GROUND_TRUTH, TOPIC_REAR_CAMERA, TOPIC_LIDAR)
    }
    camera_schema = _schema_name(scanned, TOPIC_CAMERA)
    frames = [
        _frame(
            time,
            _decode(TOPIC_CAMERA, record, camera_schema),
            channels[TOPIC_LOCATION][i],
            channels[TOPIC_POSE][i],
            channels[TOPIC_CAN][i],
            optional[TOPIC_GROUND_TRUTH][i],
            optional[TOPIC_REAR_CAMERA][i],
            optional[TOPIC_LIDAR][i],
        )
        for i, (time, record) in enumerate(zip(camera_times, camera_records, strict=True))
    ]
    events = [_event(record) for record in scanned.messages.get(TOPIC_TRIGGERS, [])]
    # Optional (logs from before the degradation state machine have no such channel).
    degradation = [_degradation(r) for r in scanned.messages.get(TOPIC_DEGRADATION, [])]
    if metadata is None:
        found = scanned.drive_log_metadata()
        metadata = found[0] if found else {}
    return DriveLog(metadata=dict(metadata), frames=frames, events=events, degradation=degradation)


# --------------------------------------------------------------------------- public API


def read_drive_log(source: Source, profile: str | None = None) -> DriveLog:
    """The whole log, integrity-checked; raises :class:`DriveLogError` for damaged files.

    A file in the simulated fleet's layout is read here; any other recording (or a named
    ``profile``) through its source profile (``logs.sources``).
    """
    scanned = scan_mcap(source)
    if profile not in (None, SIMULATED_PROFILE) or scanned.channel(TOPIC_CAMERA) is None:
        from aiinfra_pipelines.logs.sources.build import read_profiled_log

        return read_profiled_log(scanned, profile)
    found = scanned.drive_log_metadata()
    if not found:
        raise DriveLogError(errors.MISSING_METADATA, f"no '{METADATA_NAME}' metadata record")
    return build_drive_log(scanned, found[0])


def _open_indexed(stream: BinaryIO) -> tuple[SeekingReader, Summary | None]:
    """A CRC-validating seeking reader and the file's summary (``None`` if it has none)."""
    with _translate_errors():
        size = _check_envelope(stream)
        reader = SeekingReader(stream, validate_crcs=True, record_size_limit=size)
        return reader, reader.get_summary()


def read_metadata(source: Source) -> dict[str, str]:
    """The ``drive_log`` metadata record, read through the index without decoding frames."""
    with _open_source(source) as stream:
        reader, summary = _open_indexed(stream)
        if summary is not None and summary.metadata_indexes:
            with _translate_errors():
                records = list(reader.iter_metadata())
            found = [dict(r.metadata) for r in records if r.name == METADATA_NAME]
        else:
            stream.seek(0)
            found = _scan_stream(stream).drive_log_metadata()
    if not found:
        raise DriveLogError(errors.MISSING_METADATA, f"no '{METADATA_NAME}' metadata record")
    return found[0]


def _summary_counts(summary: Summary | None) -> dict[str, int] | None:
    if summary is None or summary.statistics is None:
        return None
    counts = summary.statistics.channel_message_counts
    return {channel.topic: counts.get(cid, 0) for cid, channel in summary.channels.items()}


def summarize_channels(source: Source) -> dict[str, int]:
    """Message count per topic (0 for registered but silent channels), from the statistics."""
    with _open_source(source) as stream:
        _reader, summary = _open_indexed(stream)
        counts = _summary_counts(summary)
        if counts is None:
            stream.seek(0)
            counts = _scan_stream(stream).message_counts()
    return counts


def iter_frames(source: Source) -> Iterator[Frame]:
    """Frames in log-time order, decompressing one chunk at a time (for large logs).

    Unlike :func:`read_drive_log` this needs every channel stamped with the exact camera time
    (as our writer does) and yields in time order, so it is for consumers of *validated* logs
    (datasets, training), not for validation itself. Files without a chunk index fall back to
    a full read.
    """
    with _open_source(source) as stream:
        reader, summary = _open_indexed(stream)
        counts = _summary_counts(summary)
        if summary is None or counts is None or not summary.chunk_indexes:
            stream.seek(0)
            scanned = _scan_stream(stream)
            yield from build_drive_log(scanned).frames
            return
        _require_frame_channels(counts, summary.channels, summary.schemas)
        yield from _group_frames(reader)


def _group_frames(reader: SeekingReader) -> Iterator[Frame]:
    topics = [*FRAME_TOPICS, TOPIC_GROUND_TRUTH]
    group: dict[str, list[McapMessage]] = defaultdict(list)
    group_time: int | None = None
    schema_names: dict[str, str] = {}
    with _translate_errors():
        messages = reader.iter_messages(topics=topics, log_time_order=True)
        for schema, channel, record in messages:
            if group_time is not None and record.log_time != group_time:
                yield from _frames_of_group(group_time, group, schema_names)
                group.clear()
            group_time = record.log_time
            group[channel.topic].append(record)
            if schema is not None:
                schema_names[channel.topic] = schema.name
    if group_time is not None:
        yield from _frames_of_group(group_time, group, schema_names)


def _frames_of_group(
    time: int, group: dict[str, list[McapMessage]], schema_names: dict[str, str]
) -> Iterator[Frame]:
    """All camera frames sharing one log time, each with that time's other channels."""
    if not group.get(TOPIC_CAMERA):
        return
    decoded: dict[str, Any] = {}
    for topic in (TOPIC_LOCATION, TOPIC_POSE, TOPIC_CAN, TOPIC_GROUND_TRUTH):
        records = group.get(topic)
        if not records and topic != TOPIC_GROUND_TRUTH:
            raise DriveLogError(
                errors.UNALIGNED_CHANNEL, f"{topic} has no message at camera time {time}"
            )
        decoded[topic] = _decode(topic, records[0]) if records else None
    for record in group[TOPIC_CAMERA]:
        yield _frame(
            time,
            _decode(TOPIC_CAMERA, record, schema_names.get(TOPIC_CAMERA)),
            decoded[TOPIC_LOCATION],
            decoded[TOPIC_POSE],
            decoded[TOPIC_CAN],
            decoded[TOPIC_GROUND_TRUTH],
        )
