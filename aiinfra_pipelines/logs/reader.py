"""Read MCAP drive logs back into :class:`DriveLog`, refusing damaged files with a reason code.

Integrity is checked before any content is trusted, in three layers, because mcap's readers
each cover only part of it: the envelope (leading magic, closing footer + magic, summary CRC,
which mcap does not check) catches truncation and cut uploads; a linear pass
(:mod:`.mcap_records`) checks every chunk CRC and the data-section CRC (which the seeking
reader skips) under the caps of ``logs.yaml`` ``limits``; only then are messages decoded.
Every failure becomes a :class:`DriveLogError` whose ``code`` is stable (see
:mod:`aiinfra_pipelines.logs.errors`).
The envelope and the error mapping live in :mod:`.mcap_envelope`, schema checks and message
decoding in :mod:`.message_decode`; this module scans, aligns and assembles.

``read_drive_log`` keeps messages in *file* order, not log-time order, so a producer whose clock
went backwards is visible to validation instead of being silently re-sorted.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np
from mcap.reader import SeekingReader
from mcap.records import Channel, Header, Metadata, Schema
from mcap.records import Message as McapMessage
from mcap.summary import Summary

from aiinfra_pipelines.logs import _config, errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.lazy_frames import NO_IMAGE, LazyFrames
from aiinfra_pipelines.logs.limits import ReadLimits
from aiinfra_pipelines.logs.mcap_envelope import (
    Source,
    check_envelope,
    open_source,
    translate_errors,
)
from aiinfra_pipelines.logs.mcap_records import iter_records
from aiinfra_pipelines.logs.message_decode import (
    check_schemas,
    decode_message,
    degradation_event,
    frame_from_messages,
    frame_payloads,
    frame_signals,
    trigger_event,
)
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
    DriveLog,
    Frame,
)
from aiinfra_pipelines.logs.payloads import DeferredMessage, PayloadStore
from aiinfra_pipelines.logs.writer import METADATA_NAME

# Channels without which a frame cannot be rebuilt; ground truth is optional (real fleets).
FRAME_TOPICS: tuple[str, ...] = (TOPIC_CAMERA, TOPIC_LOCATION, TOPIC_POSE, TOPIC_CAN)


@dataclass
class ScannedLog:
    """Every record of an integrity-checked MCAP file, messages still undecoded, in file order."""

    header: Header | None = None
    schemas: dict[int, Schema] = field(default_factory=dict)
    channels: dict[int, Channel] = field(default_factory=dict)
    # Large payloads are DeferredMessage (read back on use) when scanned with ``deferred``.
    messages: dict[str, list[McapMessage]] = field(default_factory=lambda: defaultdict(list))
    metadata: list[Metadata] = field(default_factory=list)
    # SHA-256 of the file's bytes: a content id for logs whose recorder writes none
    # (logs.sources.metadata derives a ROS 2 bag's log_id from it).
    sha256: str = ""

    def message_counts(self) -> dict[str, int]:
        """Messages per topic, including registered channels that carry none."""
        counts = {channel.topic: 0 for channel in self.channels.values()}
        counts.update({topic: len(messages) for topic, messages in self.messages.items()})
        return counts

    def channel_rows(self) -> list[dict[str, Any]]:
        """Every channel with its encoding, schema, message count and rate (by topic)."""
        rows = []
        for channel in sorted(self.channels.values(), key=lambda c: c.topic):
            schema = self.schemas.get(channel.schema_id)
            records = self.messages.get(channel.topic, [])
            rate = rate_hz(sorted(record.log_time for record in records))
            rows.append(
                {
                    "topic": channel.topic,
                    "encoding": channel.message_encoding,
                    "schema": "" if schema is None else schema.name,
                    "messages": len(records),
                    "rate_hz": None if rate is None else round(rate, 3),
                }
            )
        return rows

    def channel(self, topic: str) -> Channel | None:
        return next((c for c in self.channels.values() if c.topic == topic), None)

    def schema_for(self, topic: str) -> Schema | None:
        channel = self.channel(topic)
        return None if channel is None else self.schemas.get(channel.schema_id)

    def drive_log_metadata(self) -> list[dict[str, str]]:
        """All ``drive_log`` metadata records (a valid file has exactly one)."""
        return [dict(record.metadata) for record in self.metadata if record.name == METADATA_NAME]


# --------------------------------------------------------------------------- scanning


def _collect(scanned: ScannedLog, record: Any) -> None:
    if isinstance(record, McapMessage | DeferredMessage):
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


_HASH_BLOCK = 1 << 20


class _HashingStream:
    """Hashes what the scan reads as it reads it, so the file is read once, not twice."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.digest.update(data)
        return data

    def tell(self) -> int:
        return self._stream.tell()

    def rest(self) -> str:
        """The SHA-256 of the whole file, reading what the scan left (the closing magic)."""
        while self.read(_HASH_BLOCK):
            pass
        return self.digest.hexdigest()


def _scan_stream(
    stream: BinaryIO, limits: ReadLimits | None = None, store: PayloadStore | None = None
) -> ScannedLog:
    limits = limits or ReadLimits.load()
    with translate_errors():
        size = check_envelope(stream)
        stream.seek(0)
        hashing = _HashingStream(stream)
        scanned = ScannedLog()
        for record in iter_records(hashing, size, limits, store):  # type: ignore[arg-type]
            _collect(scanned, record)
        scanned.sha256 = hashing.rest()
    return scanned


def scan_mcap(
    source: Source, limits: ReadLimits | None = None, *, deferred: bool = False
) -> ScannedLog:
    """Read and integrity-check every record under ``limits`` (logs.yaml's by default);
    raises :class:`DriveLogError` on damage or on a file past a cap.

    ``deferred=True`` keeps large payloads in the file (:mod:`.payloads`): the scan's memory
    then grows with the number of messages, not their bytes. The source must stay readable
    while the result is used (a path is reopened; bytes or a stream are kept).
    """
    limits = limits or ReadLimits.load()
    with open_source(source) as stream:
        store = None
        if deferred:
            kept = source if isinstance(source, str | os.PathLike) else stream
            store = PayloadStore(kept, limits)
        return _scan_stream(stream, limits, store)


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
    scanned: ScannedLog, topic: str, camera_times: list[int], required: bool, decode: bool = True
) -> list[Any | None]:
    """Each camera frame's message of ``topic``, decoded (or the record, ``decode=False``)."""
    aligned = align_records(camera_times, scanned.messages.get(topic, []), _tolerance_ns())
    schema_name = _schema_name(scanned, topic)
    decoded = []
    for time, record in zip(camera_times, aligned, strict=True):
        if record is None and required:
            raise DriveLogError(
                errors.UNALIGNED_CHANNEL, f"{topic} has no message near camera frame {time}"
            )
        if record is None or not decode:
            decoded.append(record)
        else:
            decoded.append(decode_message(topic, record, schema_name))
    return decoded


class _PayloadLoader:
    """Decodes frame ``i``'s camera, rear camera and LiDAR messages (for :class:`LazyFrames`)."""

    def __init__(self, scanned: ScannedLog, records: dict[str, list[Any]], times: list[int]):
        self._records = records
        self._times = times
        self._schemas = {topic: _schema_name(scanned, topic) for topic in records}

    def _decoded(self, topic: str, index: int) -> Any | None:
        record = self._records[topic][index]
        return None if record is None else decode_message(topic, record, self._schemas[topic])

    def __call__(self, index: int) -> dict[str, Any]:
        return frame_payloads(
            self._times[index],
            self._decoded(TOPIC_CAMERA, index),
            self._decoded(TOPIC_REAR_CAMERA, index),
            self._decoded(TOPIC_LIDAR, index),
        )


def build_drive_log(
    scanned: ScannedLog, metadata: dict[str, str] | None = None, *, lazy: bool = False
) -> DriveLog:
    """Decode and align a scanned file into frames (file order) and trigger events.

    ``lazy=True`` decodes signals now and each frame's images and LiDAR when the frame is read
    (:class:`LazyFrames`): the streaming ingest path, whose memory must not grow with the log.
    """
    _require_frame_channels(scanned.message_counts(), scanned.channels, scanned.schemas)
    camera_records = scanned.messages[TOPIC_CAMERA]
    camera_times = [record.log_time for record in camera_records]
    channels = {
        topic: _aligned_channel(scanned, topic, camera_times, required=True)
        for topic in (TOPIC_LOCATION, TOPIC_POSE, TOPIC_CAN)
    }
    # Optional: ground truth (simulation only), and the rig's rear camera and LiDAR (fleet-7).
    ground_truth = (
        _aligned_channel(scanned, TOPIC_GROUND_TRUTH, camera_times, required=False)
        if scanned.messages.get(TOPIC_GROUND_TRUTH)
        else [None] * len(camera_times)
    )
    payload_records = {
        topic: _aligned_channel(scanned, topic, camera_times, required=False, decode=False)
        if scanned.messages.get(topic)
        else [None] * len(camera_times)
        for topic in (TOPIC_REAR_CAMERA, TOPIC_LIDAR)
    }
    payload_records[TOPIC_CAMERA] = list(camera_records)
    skeletons = [
        frame_signals(
            time,
            channels[TOPIC_LOCATION][i],
            channels[TOPIC_POSE][i],
            channels[TOPIC_CAN][i],
            ground_truth[i],
            NO_IMAGE,
        )
        for i, time in enumerate(camera_times)
    ]
    frames: Sequence[Frame] = LazyFrames(
        skeletons, _PayloadLoader(scanned, payload_records, camera_times)
    )
    if not lazy:
        frames = list(frames)
    events = [trigger_event(record) for record in scanned.messages.get(TOPIC_TRIGGERS, [])]
    # Optional (logs from before the degradation state machine have no such channel).
    degradation = [degradation_event(r) for r in scanned.messages.get(TOPIC_DEGRADATION, [])]
    if metadata is None:
        found = scanned.drive_log_metadata()
        metadata = found[0] if found else {}
    return DriveLog(metadata=dict(metadata), frames=frames, events=events, degradation=degradation)


# --------------------------------------------------------------------------- public API


def read_drive_log(
    source: Source, profile: str | None = None, *, streaming: bool = False
) -> DriveLog:
    """The whole log, integrity-checked; raises :class:`DriveLogError` for damaged files.

    A file in the simulated fleet's layout is read here; any other recording (or a named
    ``profile``) through its source profile (``logs.sources``). ``streaming=True`` leaves
    payloads in the file and decodes each frame's images when it is read (see
    :func:`~aiinfra_pipelines.logs.validation.validate_drive_log`).
    """
    scanned = scan_mcap(source, deferred=streaming)
    if profile not in (None, SIMULATED_PROFILE) or scanned.channel(TOPIC_CAMERA) is None:
        from aiinfra_pipelines.logs.sources.build import read_profiled_log

        return read_profiled_log(scanned, profile, lazy=streaming)
    found = scanned.drive_log_metadata()
    if not found:
        raise DriveLogError(errors.MISSING_METADATA, f"no '{METADATA_NAME}' metadata record")
    return build_drive_log(scanned, found[0], lazy=streaming)


def _open_indexed(stream: BinaryIO) -> tuple[SeekingReader, Summary | None]:
    """A CRC-validating seeking reader and the file's summary (``None`` if it has none)."""
    with translate_errors():
        size = check_envelope(stream)
        reader = SeekingReader(stream, validate_crcs=True, record_size_limit=size)
        return reader, reader.get_summary()


def read_metadata(source: Source) -> dict[str, str]:
    """The ``drive_log`` metadata record, read through the index without decoding frames."""
    with open_source(source) as stream:
        reader, summary = _open_indexed(stream)
        if summary is not None and summary.metadata_indexes:
            with translate_errors():
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
    with open_source(source) as stream:
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
    with open_source(source) as stream:
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
    with translate_errors():
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
        decoded[topic] = decode_message(topic, records[0]) if records else None
    for record in group[TOPIC_CAMERA]:
        yield frame_from_messages(
            time,
            decode_message(TOPIC_CAMERA, record, schema_names.get(TOPIC_CAMERA)),
            decoded[TOPIC_LOCATION],
            decoded[TOPIC_POSE],
            decoded[TOPIC_CAN],
            decoded[TOPIC_GROUND_TRUTH],
        )
