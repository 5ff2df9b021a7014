"""A frame's vehicle signals, each taken from the first source a recording carries.

A car rarely publishes the project's four CAN signals on one channel. A ROS 2 car has its speed
in ``nav_msgs/msg/Odometry`` (``twist.twist.linear.x``), its acceleration in
``sensor_msgs/msg/Imu``, and — where the stack has them — dedicated vehicle reports (Autoware's
``VelocityReport``/``SteeringReport``) or raw CAN frames decoded through a table
(:mod:`.can`). A source profile lists, per signal, the sources in order of preference
(``signals`` in resources/sources/*.yaml); the first one present in the file is used, and what
was used is reported (``signal_sources``). A signal no source provides is *unknown*: NaN in
every frame and named in ``DriveLog.unknown_signals`` — never a refusal unless the profile marks
it ``required`` (profiles without a ``signals`` section: all four from ``vehicle_status``).

Whether a source is present is decided by the file, not by schema names: a JSON channel counts
for a signal when its first message has the key, whatever its schema is called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcap.records import Channel
from mcap.records import Message as McapMessage

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.sources.can import CanSignal

# The frame's vehicle signals (logs.model.Frame), in the order a report lists them.
VEHICLE_SIGNALS: tuple[str, ...] = ("speed_mps", "accel_mps2", "steering_rad", "brake")
# The role every profile without a ``signals`` section reads all four from, by key.
DEFAULT_ROLE = "vehicle_status"
UNKNOWN = "unknown"
# The fields of ``can_msgs/msg/Frame`` a table entry reads.
_CAN_ID, _CAN_DATA = "id", "data"


@dataclass(frozen=True)
class SignalSource:
    """One place a signal may come from: a role's field (dotted path), or a CAN table entry."""

    role: str
    field: str = ""
    can: str = ""


@dataclass(frozen=True)
class SignalSpec:
    """A signal and its sources, most preferred first."""

    name: str
    sources: tuple[SignalSource, ...]
    required: bool = False


def default_signals() -> dict[str, SignalSpec]:
    """All four from the ``vehicle_status`` role's keys, each required (the original layout)."""
    return {
        name: SignalSpec(name, (SignalSource(DEFAULT_ROLE, field=name),), required=True)
        for name in VEHICLE_SIGNALS
    }


def parse_signals(
    raw: Mapping[str, Any] | None,
    roles: Sequence[str],
    can_table: Mapping[str, CanSignal],
    profile: str,
) -> dict[str, SignalSpec]:
    """The profile's ``signals`` section (``default_signals()`` when it has none).

    ``signal: [source, ...]`` or ``signal: {required: bool, sources: [...]}``; a source is
    ``{role, field}`` or ``{role, can}``. Roles and CAN entries must exist in the profile.
    """
    if raw is None:
        return default_signals()
    specs = {}
    for name, entry in raw.items():
        if name not in VEHICLE_SIGNALS:
            raise ValueError(f"source profile {profile}: {name} is not one of {VEHICLE_SIGNALS}")
        listed = entry.get("sources", []) if isinstance(entry, Mapping) else entry
        required = bool(entry.get("required", False)) if isinstance(entry, Mapping) else False
        sources = []
        for item in listed or []:
            source = SignalSource(
                role=str(item.get("role", "")),
                field=str(item.get("field", "")),
                can=str(item.get("can", "")),
            )
            if source.role not in roles:
                raise ValueError(f"source profile {profile}: {name} reads unknown role {source}")
            if bool(source.field) == bool(source.can):
                raise ValueError(f"source profile {profile}: {name} source needs field or can")
            if source.can and source.can not in can_table:
                raise ValueError(f"source profile {profile}: {name}: no CAN entry {source.can}")
            sources.append(source)
        specs[str(name)] = SignalSpec(str(name), tuple(sources), required)
    for name in VEHICLE_SIGNALS:  # a signal the section leaves out has no source: unknown
        specs.setdefault(name, SignalSpec(name, ()))
    return specs


def field_value(message: Any, path: str) -> Any:
    """The value at a dotted path of a decoded message (JSON keys or attributes); ``None``."""
    value = message
    for name in path.split("."):
        value = value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)
        if value is None:
            return None
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)  # bool is an int: a pedal switch reads 0 or 1


def nearest_samples(
    records: list[McapMessage], frame_times: list[int], max_age_ns: int, role: str
) -> list[McapMessage]:
    """Each frame's sample of ``role`` (the reader's alignment); refused where one lacks it."""
    # Imported here: the reader imports the decoders of this package, which load the profiles.
    from aiinfra_pipelines.logs.reader import align_records

    picked = align_records(frame_times, records, max_age_ns)
    for time, record in zip(frame_times, picked, strict=True):
        if record is None:
            raise DriveLogError(
                errors.UNALIGNED_CHANNEL,
                f"{role} has no sample within {max_age_ns / 1e9:g} s of camera frame {time}",
            )
    return picked  # type: ignore[return-value]  # no None left


@dataclass
class SignalValues:
    """Per signal: one value per frame (NaN where unknown) and where it came from."""

    values: dict[str, list[float]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def unknown(self) -> frozenset[str]:
        return frozenset(name for name, where in self.sources.items() if where == UNKNOWN)


Records = Callable[[str], tuple[Channel | None, list[McapMessage]]]
Decode = Callable[[Channel, McapMessage], Any]


class SignalReader:
    """Reads a profile's signals for the camera frames at ``frame_times``.

    ``records(role)`` gives a role's channel and records, ``decode(channel, record)`` a decoded
    message (the frame builder's, so every message is decoded once).
    """

    def __init__(
        self, profile: Any, records: Records, decode: Decode, frame_times: list[int]
    ) -> None:
        self.profile = profile
        self.records = records
        self.decode = decode
        self.frame_times = frame_times
        self.used_roles: list[str] = []

    def read(self) -> SignalValues:
        found = SignalValues()
        nan = [float("nan")] * len(self.frame_times)
        for name in VEHICLE_SIGNALS:
            spec = self.profile.signals.get(name) or SignalSpec(name, ())
            result = self._first_source(spec)
            values, where = result if result is not None else (nan, UNKNOWN)
            found.values[name], found.sources[name] = values, where
        return found

    def _first_source(self, spec: SignalSpec) -> tuple[list[float], str] | None:
        lacking = []
        for source in spec.sources:
            result = self._from_can(source) if source.can else self._from_field(source)
            if result is not None:
                if source.role not in self.used_roles:
                    self.used_roles.append(source.role)
                return result
            lacking.append(self._describe(source))
        if spec.required:
            raise DriveLogError(
                errors.MISSING_CHANNEL,
                f"{spec.name} has no source; looked at {', '.join(lacking) or 'nothing'}",
            )
        return None

    def _describe(self, source: SignalSource) -> str:
        spec = self.profile.role(source.role)
        topic = spec.topic if spec is not None else source.role
        if source.can:
            return f"{topic} {self.profile.can[source.can].describe()}"
        return f"{topic} {source.field}"

    def _max_age_ns(self, role: str) -> int:
        return round(self.profile.role(role).max_age_s * 1e9)

    def _from_field(self, source: SignalSource) -> tuple[list[float], str] | None:
        channel, records = self.records(source.role)
        if channel is None or not records:
            return None
        if not _is_number(field_value(self.decode(channel, records[0]), source.field)):
            return None  # a status without this key: another source may have it
        picked = nearest_samples(
            records, self.frame_times, self._max_age_ns(source.role), source.role
        )
        values = []
        for record in picked:
            value = field_value(self.decode(channel, record), source.field)
            if not _is_number(value):
                raise DriveLogError(
                    errors.DECODE_ERROR,
                    f"{channel.topic} message at {record.log_time} lacks a number at "
                    f"{source.field!r}",
                )
            values.append(float(value))
        return values, self._describe(source)

    def _from_can(self, source: SignalSource) -> tuple[list[float], str] | None:
        channel, records = self.records(source.role)
        if channel is None or not records:
            return None
        table = self.profile.can[source.can]
        frames = [
            record
            for record in records
            if field_value(self.decode(channel, record), _CAN_ID) == table.frame_id
        ]
        if not frames:
            return None
        picked = nearest_samples(
            frames, self.frame_times, self._max_age_ns(source.role), source.can
        )
        values = [
            table.decode(
                bytes(field_value(self.decode(channel, record), _CAN_DATA) or b""),
                f"{channel.topic} message at {record.log_time}",
            )
            for record in picked
        ]
        return values, self._describe(source)
