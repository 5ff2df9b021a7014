"""Rebuilding frames from a real car's recording through its source profile.

The front camera is the frame clock: each camera message is a frame, and every other frame role
(GNSS, pose, the vehicle signals' sources) contributes its sample nearest in log time, within the
role's ``max_age_s`` — real sensors run at their own rates and are never stamped alike. A frame
role the profile does not require and the file does not carry is unknown, not a refusal: NaN in
every frame and named in ``DriveLog.unknown_signals`` (a ROS 2 car without GNSS still has
camera frames worth indexing); where each signal came from is reported. Sensors that
only flow through (calibration, LiDAR, IMU, transforms) are decoded and checked here so that a
log whose calibration or point clouds cannot be read is refused at the door, and summarized
per sensor for the inspection report and the scene index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mcap.records import Channel
from mcap.records import Message as McapMessage

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.lazy_frames import NO_IMAGE, LazyFrames
from aiinfra_pipelines.logs.model import DriveLog, Frame, TriggerEvent
from aiinfra_pipelines.logs.payloads import DeferredMessage
from aiinfra_pipelines.logs.reader import rate_hz
from aiinfra_pipelines.logs.rig import calibration_sha256
from aiinfra_pipelines.logs.sources import decode
from aiinfra_pipelines.logs.sources.metadata import derive_metadata
from aiinfra_pipelines.logs.sources.profiles import CALIBRATION_SUFFIX, SourceProfile
from aiinfra_pipelines.logs.sources.signals import (
    UNKNOWN,
    VEHICLE_SIGNALS,
    SignalReader,
    nearest_samples,
)

# Roles whose messages carry the sensor's own time stamp, checked against the log clock.
STAMPED_ROLES: tuple[str, ...] = (
    "front_camera",
    "rear_camera",
    "lidar",
    "gnss",
    "pose",
    "imu",
    "vehicle_status",
    "velocity_report",
    "steering_report",
    "can",
)
# Cameras a profile may map; each one's calibration is the role ``<camera>_calibration``.
CAMERA_ROLES: tuple[str, ...] = ("front_camera", "rear_camera")

# Roles decoded only to check (LiDAR's layout) and summarize; they do not become frame fields
# (the IMU may still feed a signal, :mod:`.signals`).
PASS_THROUGH_ROLES: tuple[str, ...] = ("lidar", "imu", "static_transforms")
# Frame fields read from the GNSS fix and from the pose, unknown together when a role is absent.
POSITION_SIGNALS: tuple[str, ...] = ("latitude", "longitude")
POSE_SIGNALS: tuple[str, ...] = ("x", "y", "heading")


@dataclass
class SensorSummary:
    """One role as found in the file: topic, schema, message count and rate."""

    role: str
    topic: str
    schema: str
    messages: int
    rate_hz: float | None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "topic": self.topic,
            "schema": self.schema,
            "messages": self.messages,
            "rate_hz": self.rate_hz,
            **self.details,
        }


def channels_by_topic(
    channels: dict[int, Channel], schemas: dict[int, Any]
) -> dict[str, tuple[str, str]]:
    """topic -> (message encoding, schema name), what profile matching compares."""
    found = {}
    for channel in channels.values():
        schema = schemas.get(channel.schema_id)
        found[channel.topic] = (channel.message_encoding, "" if schema is None else schema.name)
    return found


def _rate(records: list[McapMessage]) -> float | None:
    rate = rate_hz([record.log_time for record in records])
    return None if rate is None else round(rate, 3)


class ProfileLogBuilder:
    """Decodes a scanned file's roles with one :class:`SourceProfile`."""

    def __init__(self, scanned: Any, profile: SourceProfile, *, lazy: bool = False) -> None:
        self.scanned = scanned
        self.profile = profile
        # Frames decode their images when read (logs.lazy_frames): the streaming ingest path.
        self.lazy = lazy
        self.decoder = decode.MessageDecoder(scanned.schemas)
        # Decoded messages by record identity: building frames, checking sensors and reading
        # their clocks visit the same records; each is decoded once.
        self._decoded_records: dict[int, Any] = {}
        self.sensors: list[SensorSummary] = []
        # What is wrong with the sensors that do not form frames (calibration, LiDAR, IMU,
        # transforms): collected, so a report names every problem, not just the first.
        self.problems: list[DriveLogError] = []
        # Condition keys the recording did not state, with how validation derived each.
        self.derived_conditions: dict[str, str] = {}
        # What the calibration hash covers: each camera's intrinsics, every static transform.
        self.calibrations: dict[str, dict[str, Any]] = {}
        self.transforms: list[dict[str, Any]] = []
        # Frame signal -> where its values came from ("unknown": the log does not carry it).
        self.signal_sources: dict[str, str] = {}

    def _records(self, role: str) -> tuple[Channel | None, list[McapMessage]]:
        spec = self.profile.role(role)
        if spec is None:
            return None, []
        channel = self.scanned.channel(spec.topic)
        return channel, list(self.scanned.messages.get(spec.topic, []))

    def _decode(self, channel: Channel, record: McapMessage) -> Any:
        if isinstance(record, DeferredMessage):  # a payload left in the file stays there
            return self.decoder.decode(channel, record)
        key = id(record)  # the scanned log keeps every record alive, so ids are stable
        if key not in self._decoded_records:
            self._decoded_records[key] = self.decoder.decode(channel, record)
        return self._decoded_records[key]

    def _decoded(self, role: str) -> list[Any]:
        channel, records = self._records(role)
        if channel is None:
            return []
        return [self._decode(channel, record) for record in records]

    def _summarize(self, role: str, **details: Any) -> None:
        spec = self.profile.role(role)
        channel, records = self._records(role)
        if spec is None or channel is None or any(s.role == role for s in self.sensors):
            return
        schema = self.scanned.schemas.get(channel.schema_id)
        name = spec.schema if schema is None else schema.name  # raw or JPEG, as recorded
        self.sensors.append(
            SensorSummary(role, spec.topic, name, len(records), _rate(records), details)
        )

    def _check_calibration(self, camera: str, image_shape: tuple[int, ...] | None) -> None:
        role = camera + CALIBRATION_SUFFIX
        spec = self.profile.role(role)
        messages = self._decoded(role)
        label = camera.replace("_", " ")
        if not messages:
            if spec is not None and spec.required:
                raise DriveLogError(
                    errors.MISSING_CALIBRATION,
                    f"{label} calibration was not recorded (looked at "
                    f"{', '.join(self.profile.looked_at(role))})",
                )
            return
        calibration = decode.calibration(messages[-1])
        problems = calibration.problems(image_shape)
        if problems:
            raise DriveLogError(
                errors.BAD_CALIBRATION, f"{label} calibration: {'; '.join(problems)}"
            )
        self.calibrations[role] = calibration.canonical()
        self._summarize(
            role,
            width=calibration.width,
            height=calibration.height,
            k=list(calibration.k),
            distortion_model=calibration.distortion_model,
        )

    def _image_shape(self, camera: str) -> tuple[int, ...] | None:
        """The first image's shape of a camera that does not form frames (its size check)."""
        channel, records = self._records(camera)
        if channel is None or not records:
            return None
        first = records[0]
        return decode.image_rgb(self._decode(channel, first), f"{camera} {first.log_time}").shape

    def check_sensors(self, image_shapes: dict[str, tuple[int, ...]]) -> None:
        """Every camera's calibration, the rear cameras, and the pass-through sensors.

        ``image_shapes`` gives the cameras already decoded (the front camera, and the rear
        one where the reader decoded it); any other camera's first image is decoded here.
        Problems are collected in :attr:`problems`, so a report names every one of them.
        """
        for camera in CAMERA_ROLES:
            if self.profile.role(camera) is None:
                continue
            try:
                shape = image_shapes.get(camera) or self._image_shape(camera)
                if camera != "front_camera" and shape is not None:
                    self._summarize(camera, width=shape[1], height=shape[0])
                self._check_calibration(camera, shape)
            except DriveLogError as problem:
                self.problems.append(problem)
        try:
            self._check_pass_through()
        except DriveLogError as problem:
            self.problems.append(problem)

    def check_required(self, roles: Sequence[str]) -> None:
        """Roles a sensor configuration must record (logs.yaml ``sensor_configs``)."""
        for role in roles:
            spec = self.profile.role(role)
            _channel, records = self._records(role)
            if records:
                continue
            code = (
                errors.MISSING_CALIBRATION
                if role.endswith(CALIBRATION_SUFFIX)
                else errors.MISSING_CHANNEL
            )
            where = (
                ", ".join(self.profile.looked_at(role))
                if spec is not None
                else f"not mapped by {self.profile.name}"
            )
            self.problems.append(
                DriveLogError(code, f"{role} ({where}) is required by the sensor config")
            )

    def _check_pass_through(self) -> None:
        for role in PASS_THROUGH_ROLES:
            channel, records = self._records(role)
            if channel is None or not records:
                continue
            details: dict[str, Any] = {}
            if role == "lidar":  # one sweep decoded at a time: a drive's sweeps are gigabytes
                topic = self.profile.roles[role].topic
                points = [
                    decode.point_count(self._decode(channel, record), f"{topic} #{i}")
                    for i, record in enumerate(records)
                ]
                details["points_mean"] = float(np.mean(points))
            messages = [] if role == "lidar" else self._decoded(role)
            if role == "static_transforms":
                self.transforms = [t for m in messages for t in decode.static_transforms(m)]
                details["frames"] = sorted({t["child"] for t in self.transforms})
            self._summarize(role, **details)

    @property
    def calibration_sha256(self) -> str:
        """Hash of every camera calibration and static transform read (``""``: none)."""
        return calibration_sha256(self.calibrations, self.transforms)

    def summarize_frame_roles(self, image_shape: tuple[int, ...] | None) -> None:
        """The frame-forming roles as found, for logs rebuilt by the simulated reader."""
        if image_shape is not None:
            self._summarize("front_camera", width=image_shape[1], height=image_shape[0])
        for role in ("gnss", "pose", "vehicle_status", "events"):
            self._summarize(role)

    def clock_offsets(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per stamped role: (log times s, sensor stamp - log time in ms), where stamps exist."""
        offsets = {}
        for role in STAMPED_ROLES:
            channel, records = self._records(role)
            if channel is None or not records:
                continue
            times, deltas = [], []
            for record in records:
                stamp = decode.header_stamp_ns(self._decode(channel, record))
                if stamp is not None:
                    times.append(record.log_time / 1e9)
                    deltas.append((stamp - record.log_time) / 1e6)
            if deltas:
                offsets[role] = (np.asarray(times), np.asarray(deltas))
        return offsets

    def _absent(self, role: str) -> DriveLogError:
        """A required frame role without messages, naming every topic looked at."""
        return DriveLogError(
            errors.MISSING_CHANNEL,
            f"{role} has no messages (looked at {', '.join(self.profile.looked_at(role))})",
        )

    def _aligned(self, role: str, frame_times: list[int]) -> list[Any] | None:
        """Each frame's decoded sample of ``role``; ``None`` when an optional role is absent."""
        spec = self.profile.role(role)
        channel, records = self._records(role)
        if spec is None or channel is None or not records:
            if spec is not None and spec.required:
                raise self._absent(role)
            return None
        picked = nearest_samples(records, frame_times, round(spec.max_age_s * 1e9), role)
        self._summarize(role)
        return [self._decode(channel, record) for record in picked]

    def _located(
        self, role: str, names: tuple[str, ...], frame_times: list[int], read: Any
    ) -> dict[str, list[float]]:
        """GNSS or pose fields per frame, or NaN for all of ``names`` without that role."""
        messages = self._aligned(role, frame_times)
        if messages is None:
            self.signal_sources.update({name: UNKNOWN for name in names})
            return {name: [float("nan")] * len(frame_times) for name in names}
        topic = self.profile.roles[role].topic
        self.signal_sources.update({name: f"{topic} {name}" for name in names})
        columns = list(zip(*(read(message) for message in messages), strict=True))
        return {name: [float(v) for v in col] for name, col in zip(names, columns, strict=True)}

    def declared_signal_sources(self) -> dict[str, str]:
        """Where a log rebuilt by the simulated reader takes each signal from (its profile's
        first source of each), for the same report a real car's log gets."""
        sources = {}
        for name in VEHICLE_SIGNALS:
            spec = self.profile.signals.get(name)
            first = spec.sources[0] if spec is not None and spec.sources else None
            role = self.profile.role(first.role) if first is not None else None
            sources[name] = UNKNOWN if role is None else f"{role.topic} {first.field}"
        for role, names in (("gnss", POSITION_SIGNALS), ("pose", POSE_SIGNALS)):
            spec = self.profile.role(role)
            sources.update({n: UNKNOWN if spec is None else f"{spec.topic} {n}" for n in names})
        return sources

    def build(self, metadata: dict[str, str]) -> DriveLog:
        channel, camera_records = self._records("front_camera")
        if channel is None or not camera_records:
            raise self._absent("front_camera")
        frame_times = [record.log_time for record in camera_records]
        load = _FrontImages(self.decoder, channel, camera_records)
        first = load(0)["image"]
        self._summarize("front_camera", width=first.shape[1], height=first.shape[0])
        self.check_sensors({"front_camera": first.shape})
        columns = self._located("gnss", POSITION_SIGNALS, frame_times, decode.position_fix)
        columns |= self._located("pose", POSE_SIGNALS, frame_times, decode.pose_xy_heading)
        signals = SignalReader(self.profile, self._records, self._decode, frame_times)
        found = signals.read()
        for role in signals.used_roles:
            self._summarize(role)
        columns |= found.values
        self.signal_sources.update(found.sources)
        skeletons = [
            Frame(
                timestamp_ns=time,
                image=NO_IMAGE,
                **{name: values[i] for name, values in columns.items()},
            )
            for i, time in enumerate(frame_times)
        ]
        frames: Sequence[Frame] = LazyFrames(skeletons, load)
        if not self.lazy:
            frames = list(frames)
        unknown = frozenset(name for name, where in self.signal_sources.items() if where == UNKNOWN)
        return DriveLog(
            metadata=dict(metadata), frames=frames, events=self._events(), unknown_signals=unknown
        )

    def _events(self) -> list[TriggerEvent]:
        channel, records = self._records("events")
        if channel is None:
            return []
        events = []
        for record in records:
            message = self._decode(channel, record)
            try:
                events.append(
                    TriggerEvent(
                        timestamp_ns=record.log_time,
                        rule=str(message["rule"]),
                        value=float(message.get("value", 0.0)),
                        threshold=float(message.get("threshold", 0.0)),
                    )
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise DriveLogError(
                    errors.DECODE_ERROR, f"event at {record.log_time} is not a trigger: {exc}"
                ) from exc
        self._summarize("events")
        return events


class _FrontImages:
    """Frame ``i``'s front image decoded to rgb8 (the payload loader of :class:`LazyFrames`)."""

    def __init__(self, decoder: Any, channel: Channel, records: list[McapMessage]) -> None:
        self._decoder = decoder
        self._channel = channel
        self._records = records

    def __call__(self, index: int) -> dict[str, Any]:
        record = self._records[index]
        message = self._decoder.decode(self._channel, record)
        return {"image": decode.image_rgb(message, f"frame {record.log_time}")}


def read_profiled_log(scanned: Any, name: str | None = None, *, lazy: bool = False) -> DriveLog:
    """A real car's log read with its source profile (named, or matched by channels).

    Its metadata is the profile's record completed by the profile's derived map (the log id
    from the content hash, ``unknown`` for what a recorder never writes), as validation sees it.
    """
    from aiinfra_pipelines.logs.sources.profiles import match_profile

    profile = match_profile(channels_by_topic(scanned.channels, scanned.schemas), name)
    metadata = derive_metadata(profile, scanned)
    if not metadata.records and not profile.metadata_derived:
        raise DriveLogError(
            errors.MISSING_METADATA, f"no '{profile.metadata_record}' metadata record"
        )
    return ProfileLogBuilder(scanned, profile, lazy=lazy).build(metadata.values)


@dataclass(frozen=True)
class ClockSync:
    """One sensor's clock against the front camera's: constant skew and drift over the log."""

    role: str
    skew_ms: float
    drift_ppm: float
    samples: int


def clock_sync(offsets: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[ClockSync]:
    """Skew (median stamp offset minus the camera's) and drift (slope) of every stamped sensor.

    A sensor stamps its own measurements; the recorder stamps arrival (log time). Transport
    latency is a constant part of both offsets, so the camera's offset is the reference: what
    differs from it is a sensor clock that is off (skew) or runs at another rate (drift).
    """
    if "front_camera" not in offsets:
        return []
    reference = float(np.median(offsets["front_camera"][1]))
    result = []
    for role, (times, deltas) in offsets.items():
        drift = 0.0
        if len(times) >= 3 and float(np.ptp(times)) > 0:
            slope_ms_per_s = float(np.polyfit(times - times[0], deltas, 1)[0])
            drift = slope_ms_per_s * 1000.0  # ms per s = 1e-3; in parts per million
        result.append(
            ClockSync(
                role, round(float(np.median(deltas)) - reference, 3), round(drift, 1), len(deltas)
            )
        )
    return result
