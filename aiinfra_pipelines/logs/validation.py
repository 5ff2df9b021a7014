"""Decide whether an uploaded drive log may enter the lake, and say exactly why not.

``validate_drive_log`` never raises for bad data: the ingest asset must turn every rejected
upload into a quarantine entry with reasons an operator can act on, and one bad file must not
fail a whole batch. It collects as many independent reasons as the file allows (a log with a
missing key *and* NaN speeds reports both); only integrity failures stop early, because nothing
in a damaged file can be trusted.

Reason codes (stable, used by dashboards and tests):

- integrity (from the reader): ``empty``, ``not_mcap``, ``truncated``, ``crc_mismatch``,
  ``corrupt``, ``unreadable``
- channels: ``missing_channel``, ``wrong_schema``, ``decode_error``, ``unaligned_channel``,
  ``bad_image``
- metadata: ``missing_metadata``, ``duplicate_metadata``, ``schema_drift``,
  ``empty_metadata_value``, ``invalid_category``, ``invalid_recorded_at``, ``invalid_vin``,
  ``invalid_pseudonym`` (anonymized logs)
- timing: ``too_few_frames``, ``non_monotonic_time``, ``frame_rate_out_of_range``,
  ``time_gap``, ``event_outside_log``
- signals and images: ``non_finite_signal``, ``signal_out_of_range``, ``empty_image``,
  ``inconsistent_image_dims``

Thresholds come from the ``validation`` section of ``resources/logs.yaml``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from aiinfra_pipelines.logs import _config, errors
from aiinfra_pipelines.logs.anonymize import PSEUDONYM_KEY, PSEUDONYM_PREFIX
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.message_decode import check_schemas
from aiinfra_pipelines.logs.model import (
    METADATA_SCHEMA_VERSION,
    OPTIONAL_METADATA_KEYS,
    REQUIRED_METADATA_KEYS,
    REQUIRED_TOPICS,
    SIMULATED_PROFILE,
    TOPIC_CAMERA,
    DriveLog,
)
from aiinfra_pipelines.logs.pii_check import (
    RESIDUAL_PII,
    PiiFinding,
    describe_findings,
    find_residual_pii,
)
from aiinfra_pipelines.logs.reader import ScannedLog, build_drive_log, rate_hz, scan_mcap
from aiinfra_pipelines.logs.sources.build import (
    ClockSync,
    ProfileLogBuilder,
    channels_by_topic,
    clock_sync,
)
from aiinfra_pipelines.logs.sources.conditions import fill_conditions
from aiinfra_pipelines.logs.sources.profiles import SourceProfile, load_profiles, match_profile

# Frame attributes checked for finiteness; the ones with a range in logs.yaml are also bounded.
SIGNALS: tuple[str, ...] = (
    "speed_mps",
    "accel_mps2",
    "steering_rad",
    "brake",
    "latitude",
    "longitude",
    "x",
    "y",
    "heading",
)


@dataclass(frozen=True)
class Reason:
    """Why a log was rejected: a stable ``code`` and a message naming the offending item."""

    code: str
    message: str


@dataclass
class ValidationReport:
    """The verdict on one uploaded file, with what could be measured even when rejected."""

    accepted: bool
    reasons: list[Reason] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    frame_count: int = 0
    duration_s: float = 0.0
    frame_rate_hz: float | None = None
    log: DriveLog | None = None
    # The source profile the file was read with (resources/sources), and its sensors as found.
    profile: str | None = None
    sensors: list[dict[str, Any]] = field(default_factory=list)
    # Conditions a real recording did not state, and how each was derived (or "unknown").
    derived_conditions: dict[str, str] = field(default_factory=dict)
    # SHA-256 of the cameras' calibration and the static transforms as recorded ("" if none).
    calibration_sha256: str = ""
    # Regions the cloud's PII check found still readable (logs.pii_check); any one quarantines.
    pii_findings: list[PiiFinding] = field(default_factory=list)

    @property
    def codes(self) -> list[str]:
        return [reason.code for reason in self.reasons]

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (no frames) for Dagster metadata and quarantine records."""
        return {
            "accepted": self.accepted,
            "reasons": [{"code": r.code, "message": r.message} for r in self.reasons],
            "metadata": dict(self.metadata),
            "frame_count": self.frame_count,
            "duration_s": self.duration_s,
            "frame_rate_hz": self.frame_rate_hz,
            "profile": self.profile,
            "sensors": list(self.sensors),
            "derived_conditions": dict(self.derived_conditions),
            "calibration_sha256": self.calibration_sha256,
        }


# --------------------------------------------------------------------------- rules


_LOCATION_SIGNALS = frozenset({"latitude", "longitude"})


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve_rules(rules: dict[str, Any] | None = None) -> dict[str, Any]:
    """logs.yaml's ``validation`` section with ``rules`` merged over it (tests, experiments).

    Merging rather than replacing lets a caller tighten one threshold without restating all.
    """
    return _deep_merge(_config.section("validation"), rules or {})


# --------------------------------------------------------------------------- channel checks


def check_channels(scanned: ScannedLog) -> list[Reason]:
    """Required channels must exist with at least one message, with the schema we write."""
    counts = scanned.message_counts()
    reasons = [
        Reason(errors.MISSING_CHANNEL, f"required channel {topic} has no messages")
        for topic in REQUIRED_TOPICS
        if counts.get(topic, 0) == 0
    ]
    reasons += [
        Reason(problem.code, problem.message)
        for problem in check_schemas(scanned.channels, scanned.schemas)
    ]
    return reasons


# --------------------------------------------------------------------------- metadata checks


def expected_metadata_keys(anonymized: bool = False) -> tuple[str, ...]:
    """The raw contract, or the one after anonymization (``vin`` -> ``vehicle_pseudonym``)."""
    if not anonymized:
        return REQUIRED_METADATA_KEYS
    return tuple(PSEUDONYM_KEY if key == "vin" else key for key in REQUIRED_METADATA_KEYS)


def _check_keys(metadata: dict[str, str], anonymized: bool) -> list[Reason]:
    expected = expected_metadata_keys(anonymized)
    missing = [key for key in expected if key not in metadata]
    unexpected = sorted(set(metadata) - set(expected) - set(OPTIONAL_METADATA_KEYS))
    reasons = []
    if missing or unexpected:
        parts = [f"missing keys {missing}"] if missing else []
        parts += [f"unexpected keys {unexpected}"] if unexpected else []
        reasons.append(Reason("schema_drift", "metadata " + " and ".join(parts)))
    version = metadata.get("metadata_schema_version")
    if version is not None and version != METADATA_SCHEMA_VERSION:
        reasons.append(
            Reason(
                "schema_drift",
                f"metadata_schema_version {version!r} is not the supported "
                f"{METADATA_SCHEMA_VERSION!r}",
            )
        )
    empty = [key for key in expected if metadata.get(key) == ""]
    if empty:
        reasons.append(Reason("empty_metadata_value", f"metadata keys with empty values {empty}"))
    return reasons


def _check_categories(metadata: dict[str, str], rules: dict[str, Any]) -> list[Reason]:
    reasons = []
    for key, allowed in rules["categories"].items():
        value = metadata.get(key)
        if value is not None and value not in allowed:
            reasons.append(
                Reason("invalid_category", f"{key}={value!r} is not one of {list(allowed)}")
            )
    return reasons


def _check_recorded_at(metadata: dict[str, str], rules: dict[str, Any]) -> list[Reason]:
    value = metadata.get("recorded_at")
    if value is None:
        return []
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return [Reason("invalid_recorded_at", f"recorded_at {value!r} is not ISO-8601")]
    if rules["recorded_at_requires_timezone"] and parsed.tzinfo is None:
        # A naive time is ambiguous across a fleet spanning time zones.
        return [Reason("invalid_recorded_at", f"recorded_at {value!r} has no UTC offset")]
    return []


def _check_pseudonym(metadata: dict[str, str]) -> list[Reason]:
    value = metadata.get(PSEUDONYM_KEY)
    if value is None or re.fullmatch(rf"{PSEUDONYM_PREFIX}[0-9a-f]+", value):
        return []
    return [Reason("invalid_pseudonym", f"{PSEUDONYM_KEY} {value!r} is not a pseudonym")]


def _check_vin(metadata: dict[str, str], rules: dict[str, Any]) -> list[Reason]:
    value = metadata.get("vin")
    if value is None or re.fullmatch(rules["vin_pattern"], value):
        return []
    return [Reason("invalid_vin", f"vin of length {len(value)} does not match the VIN pattern")]


def check_metadata(
    metadata: dict[str, str], rules: dict[str, Any], anonymized: bool = False
) -> list[Reason]:
    """Key set, schema version, categorical values, recorded_at and VIN (or pseudonym) format."""
    return [
        *_check_keys(metadata, anonymized),
        *_check_categories(metadata, rules),
        *_check_recorded_at(metadata, rules),
        *(_check_pseudonym(metadata) if anonymized else _check_vin(metadata, rules)),
    ]


def _metadata_reasons(
    scanned: ScannedLog, rules: dict[str, Any], anonymized: bool
) -> tuple[dict, list[Reason]]:
    records = scanned.drive_log_metadata()
    if not records:
        return {}, [Reason(errors.MISSING_METADATA, "no 'drive_log' metadata record")]
    reasons = []
    if len(records) > 1:
        reasons.append(
            Reason("duplicate_metadata", f"{len(records)} 'drive_log' records; the first is used")
        )
    return records[0], reasons + check_metadata(records[0], rules, anonymized)


# --------------------------------------------------------------------------- content checks


def check_timing(times_ns: Iterable[int], rules: dict[str, Any]) -> list[Reason]:
    """Count, strict monotonicity, average rate and the longest gap of camera frames."""
    times = np.asarray(list(times_ns), dtype=np.int64)
    reasons = []
    if len(times) < rules["min_frames"]:
        reasons.append(
            Reason("too_few_frames", f"{len(times)} frames, need at least {rules['min_frames']}")
        )
    steps = np.diff(times)
    backwards = np.flatnonzero(steps <= 0)
    if backwards.size:
        reasons.append(
            Reason(
                "non_monotonic_time",
                f"{backwards.size} frame(s) not after their predecessor, first at index "
                f"{int(backwards[0]) + 1}",
            )
        )
    rate = rate_hz(times)
    low, high = rules["frame_rate_hz"]["min"], rules["frame_rate_hz"]["max"]
    if rate is not None and not low <= rate <= high:
        reasons.append(
            Reason("frame_rate_out_of_range", f"frame rate {rate:.2f} Hz not in [{low}, {high}]")
        )
    if steps.size and steps.max() / 1e9 > rules["max_gap_s"]:
        reasons.append(
            Reason(
                "time_gap",
                f"gap of {steps.max() / 1e9:.3f} s between frames exceeds {rules['max_gap_s']} s",
            )
        )
    return reasons


def check_signal(name: str, values: np.ndarray, bounds: dict | None) -> list[Reason]:
    finite = np.isfinite(values)
    reasons = []
    if not finite.all():
        bad = np.flatnonzero(~finite)
        reasons.append(
            Reason(
                "non_finite_signal",
                f"{name} is NaN/inf in {bad.size} frame(s), first at index {int(bad[0])}",
            )
        )
    if bounds is not None:
        outside = finite & ((values < bounds["min"]) | (values > bounds["max"]))
        if outside.any():
            worst = values[outside][np.argmax(np.abs(values[outside]))]
            # Reasons are published (quarantine table, Dagster metadata): never echo a position.
            example = "" if name in _LOCATION_SIGNALS else f", e.g. {float(worst):g}"
            reasons.append(
                Reason(
                    "signal_out_of_range",
                    f"{name} outside [{bounds['min']}, {bounds['max']}] in "
                    f"{int(outside.sum())} frame(s){example}",
                )
            )
    return reasons


def check_signals(log: DriveLog, rules: dict[str, Any]) -> list[Reason]:
    """Every signal finite, and within its physical range where logs.yaml gives one."""
    reasons = []
    for name in SIGNALS:
        values = np.array([getattr(frame, name) for frame in log.frames], dtype=np.float64)
        reasons += check_signal(name, values, rules["ranges"].get(name))
    event_values = np.array([e.value for e in log.events], dtype=np.float64)
    reasons += check_signal("trigger value", event_values, None)
    return reasons


def check_images(log: DriveLog) -> list[Reason]:
    """Camera frames must be nonempty and all of one size (a model input has fixed dims)."""
    shapes = [frame.image.shape for frame in log.frames]
    reasons = []
    empty = [i for i, shape in enumerate(shapes) if 0 in shape]
    if empty:
        reasons.append(
            Reason("empty_image", f"{len(empty)} empty camera frame(s), first at index {empty[0]}")
        )
    distinct = sorted({shape for shape in shapes})
    if len(distinct) > 1:
        reasons.append(
            Reason("inconsistent_image_dims", f"camera frames have several sizes: {distinct}")
        )
    return reasons


def check_events(log: DriveLog) -> list[Reason]:
    """A trigger must fire inside the segment it kept, or the segment is not what it claims."""
    if not log.frames:
        return []
    times = [frame.timestamp_ns for frame in log.frames]
    first, last = min(times), max(times)
    outside = [e for e in log.events if not first <= e.timestamp_ns <= last]
    return [
        Reason("event_outside_log", f"trigger {e.rule} at {e.timestamp_ns} is outside the log")
        for e in outside
    ]


def check_residual_pii(
    log: DriveLog, rules: dict[str, Any]
) -> tuple[list[Reason], list[PiiFinding]]:
    """The cloud's PII check as a quarantine reason, with every finding for the report."""
    settings = rules["pii_check"]
    findings = find_residual_pii(log, settings)
    if not findings:
        return [], []
    message = describe_findings(findings, int(settings["listed_in_reason"]))
    return [Reason(RESIDUAL_PII, message)], findings


def check_log_content(log: DriveLog, rules: dict[str, Any] | None = None) -> list[Reason]:
    """Content checks on an in-memory log (also usable by the fleet before writing)."""
    resolved = resolve_rules(rules)
    return [
        *check_timing((frame.timestamp_ns for frame in log.frames), resolved),
        *check_signals(log, resolved),
        *check_images(log),
        *check_events(log),
    ]


# --------------------------------------------------------------------------- entry point


def _camera_stats(scanned: ScannedLog) -> tuple[int, float, float | None]:
    times = np.array([m.log_time for m in scanned.messages.get(TOPIC_CAMERA, [])], np.int64)
    duration = float((times.max() - times.min()) / 1e9) if len(times) > 1 else 0.0
    return len(times), duration, rate_hz(times)


# Raised by the frame builder for problems that check_channels has already reported.
_ALREADY_REPORTED = frozenset({errors.MISSING_CHANNEL, errors.WRONG_SCHEMA})


def _build(scanned: ScannedLog, metadata: dict, reasons: list[Reason]) -> DriveLog | None:
    """The decoded log, or ``None`` (with a reason) when frames cannot be rebuilt."""
    try:
        return build_drive_log(scanned, metadata)
    except DriveLogError as exc:
        if exc.code not in _ALREADY_REPORTED:
            reasons.append(Reason(exc.code, exc.message))
        return None


def _choose_profile(scanned: ScannedLog, source: str | None) -> SourceProfile | None:
    """The file's source profile; ``None`` for a damaged simulated-layout file.

    A file that no profile fits but that has any of the simulated fleet's required topics is
    read with the simulated reader anyway, so its missing channels and schemas are reported one
    by one.
    """
    channels = channels_by_topic(scanned.channels, scanned.schemas)
    profiles = load_profiles()
    try:
        return match_profile(channels, source, profiles)
    except DriveLogError:
        simulated = profiles.get(SIMULATED_PROFILE)
        # Its required topics only: the rig's (/lidar/points, /tf_static) are common names.
        topics = {spec.topic for spec in simulated.required} if simulated else set()
        if source is None and topics & set(channels):
            return None
        raise


def _validate(
    data: Any, rules: dict[str, Any], anonymized: bool, source: str | None = None
) -> ValidationReport:
    try:
        scanned = scan_mcap(data)
        profile = _choose_profile(scanned, source)
    except DriveLogError as exc:
        return ValidationReport(accepted=False, reasons=[Reason(exc.code, exc.message)])
    if profile is not None and profile.name != SIMULATED_PROFILE:
        return _validate_profiled(scanned, profile, rules, anonymized)
    metadata, reasons = _metadata_reasons(scanned, rules, anonymized)
    reasons = check_channels(scanned) + reasons
    log = _build(scanned, metadata, reasons)
    frame_count, duration, rate = _camera_stats(scanned)
    builder = ProfileLogBuilder(scanned, profile or load_profiles()[SIMULATED_PROFILE])
    sync: list[ClockSync] = []
    findings: list[PiiFinding] = []
    if log is not None:
        reasons += check_log_content(log, rules)
        sync = _check_simulated_sensors(builder, log, rules, reasons)
        pii_reasons, findings = check_residual_pii(log, rules)
        reasons += pii_reasons
    else:  # timing needs only the camera channel, so still report it
        reasons += check_timing((m.log_time for m in scanned.messages[TOPIC_CAMERA]), rules)
    return ValidationReport(
        accepted=not reasons,
        reasons=reasons,
        metadata=dict(metadata),
        frame_count=frame_count,
        duration_s=duration,
        frame_rate_hz=rate,
        log=log,
        profile=SIMULATED_PROFILE,
        sensors=_with_clock(builder.sensors, sync),
        calibration_sha256=builder.calibration_sha256,
        pii_findings=findings,
    )


def required_sensor_roles(metadata: dict[str, str], rules: dict[str, Any]) -> list[str]:
    """Roles the log's ``sensor_config_version`` must record (logs.yaml ``sensor_configs``)."""
    configs = rules.get("sensor_configs") or {}
    return [str(role) for role in configs.get(metadata.get("sensor_config_version", ""), [])]


def _check_simulated_sensors(
    builder: ProfileLogBuilder, log: DriveLog, rules: dict[str, Any], reasons: list[Reason]
) -> list[ClockSync]:
    """The rig of a simulated-layout log: calibration, LiDAR, transforms, clocks.

    The frames were rebuilt by the simulated reader; the sensors are checked through the
    simulated source profile with the same code as a real car's, so a fleet log and a ROS 2
    log are held to one standard.
    """
    first = log.frames[0] if log.frames else None
    shapes: dict[str, tuple[int, ...]] = {}
    if first is not None:
        shapes["front_camera"] = first.image.shape
        if first.rear_image is not None:
            shapes["rear_camera"] = first.rear_image.shape
    builder.summarize_frame_roles(shapes.get("front_camera"))
    builder.check_sensors(shapes)
    builder.check_required(required_sensor_roles(log.metadata, rules))
    reasons += [Reason(problem.code, problem.message) for problem in builder.problems]
    try:
        sync = clock_sync(builder.clock_offsets())
    except DriveLogError:  # an undecodable stamp: the reader has reported that message already
        return []
    reasons += check_clock_sync(sync, rules)
    return sync


def _validate_profiled(
    scanned: ScannedLog, profile: SourceProfile, rules: dict[str, Any], anonymized: bool
) -> ValidationReport:
    """A real car's recording: the profile's metadata record, decoders and alignment."""
    records = profile.metadata_records(scanned.metadata)
    reasons: list[Reason] = []
    metadata: dict[str, str] = records[0] if records else {}
    builder = ProfileLogBuilder(scanned, profile)
    camera = profile.role("front_camera")
    times = np.array(
        [m.log_time for m in scanned.messages.get(camera.topic if camera else "", [])], np.int64
    )
    log = None
    try:
        log = builder.build(metadata)
        builder.check_required(required_sensor_roles(metadata, rules))
    except DriveLogError as exc:
        reasons.append(Reason(exc.code, exc.message))
        reasons += check_timing(times.tolist(), rules)
    if not records:
        reasons.insert(
            0, Reason(errors.MISSING_METADATA, f"no '{profile.metadata_record}' metadata record")
        )
    else:
        metadata, derived = fill_conditions(metadata, log, rules["conditions"])
        if log is not None:
            log.metadata.update(metadata)
        builder.derived_conditions.update(derived)
        reasons[:0] = check_metadata(metadata, rules, anonymized)
    reasons += [Reason(problem.code, problem.message) for problem in builder.problems]
    sync = clock_sync(builder.clock_offsets())
    reasons += check_clock_sync(sync, rules)
    findings: list[PiiFinding] = []
    if log is not None:
        reasons += check_log_content(log, rules)
        pii_reasons, findings = check_residual_pii(log, rules)
        reasons += pii_reasons
    duration = float((times.max() - times.min()) / 1e9) if len(times) > 1 else 0.0
    return ValidationReport(
        accepted=not reasons,
        reasons=reasons,
        metadata=dict(metadata),
        frame_count=len(times),
        duration_s=duration,
        frame_rate_hz=rate_hz(times),
        log=log,
        profile=profile.name,
        sensors=_with_clock(builder.sensors, sync),
        derived_conditions=dict(builder.derived_conditions),
        calibration_sha256=builder.calibration_sha256,
        pii_findings=findings,
    )


def _with_clock(sensors: list[Any], sync: list[ClockSync]) -> list[dict[str, Any]]:
    by_role = {entry.role: entry for entry in sync}
    rows = []
    for sensor in sensors:
        row = sensor.to_dict()
        if sensor.role in by_role:
            row["clock_skew_ms"] = by_role[sensor.role].skew_ms
            row["clock_drift_ppm"] = by_role[sensor.role].drift_ppm
        rows.append(row)
    return rows


def check_clock_sync(sync: list[ClockSync], rules: dict[str, Any]) -> list[Reason]:
    """One reason per sensor whose clock is off the camera's beyond logs.yaml ``time_sync``."""
    limits = rules.get("time_sync") or {}
    max_skew, max_drift = float(limits["max_skew_ms"]), float(limits["max_drift_ppm"])
    return [
        Reason(
            errors.CLOCK_SKEW,
            f"{entry.role} clock is {entry.skew_ms:+.1f} ms off the camera's (limit "
            f"{max_skew:g}) and drifts {entry.drift_ppm:+.0f} ppm (limit {max_drift:g}) "
            f"over {entry.samples} stamps",
        )
        for entry in sync
        if abs(entry.skew_ms) > max_skew or abs(entry.drift_ppm) > max_drift
    ]


def validate_drive_log(
    data: bytes,
    rules: dict[str, Any] | None = None,
    *,
    anonymized: bool = False,
    source: str | None = None,
) -> ValidationReport:
    """Validate one uploaded MCAP file (bytes; a path or stream also works).

    ``rules`` overrides parts of logs.yaml's ``validation`` section. ``anonymized=True`` checks
    the post-anonymization metadata contract (``vehicle_pseudonym`` instead of ``vin``), so the
    same gate can audit the anonymized asset. Never raises for bad data;
    an unexpected internal error still becomes a rejection (code ``validation_error``) so one
    file cannot stop an ingest batch, while the message keeps the bug visible. ``source``
    names the source profile (resources/sources) to read with; by default the file's channels
    choose it.
    """
    resolved = resolve_rules(rules)
    try:
        return _validate(data, resolved, anonymized, source)
    except Exception as exc:  # the contract is "never raises", even for our own bugs
        return ValidationReport(
            accepted=False,
            reasons=[Reason("validation_error", f"{type(exc).__name__}: {exc}")],
        )
