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

Thresholds come from the ``validation`` section of ``resources/logs.yaml``. This module is the
entry point that reads a file and runs the check groups: ``validation_sensors`` (channels,
rig, clocks), ``validation_metadata``, ``validation_content`` (frames); the verdict types
are in ``validation_report`` and the thresholds in ``validation_rules``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.anonymize import PSEUDONYM_KEY
from aiinfra_pipelines.logs.errors import DriveLogError, plain
from aiinfra_pipelines.logs.model import SIMULATED_PROFILE, TOPIC_CAMERA, DriveLog
from aiinfra_pipelines.logs.pii_check import PiiFinding
from aiinfra_pipelines.logs.reader import ScannedLog, build_drive_log, rate_hz, scan_mcap
from aiinfra_pipelines.logs.sources.build import (
    ClockSync,
    ProfileLogBuilder,
    channels_by_topic,
    clock_sync,
)
from aiinfra_pipelines.logs.sources.conditions import fill_conditions
from aiinfra_pipelines.logs.sources.metadata import RecordingMetadata, derive_metadata
from aiinfra_pipelines.logs.sources.profiles import SourceProfile, load_profiles, match_profile
from aiinfra_pipelines.logs.validation_content import (
    check_log_content,
    check_residual_pii,
    check_timing,
)
from aiinfra_pipelines.logs.validation_metadata import check_metadata, metadata_reasons
from aiinfra_pipelines.logs.validation_report import Reason, ValidationReport
from aiinfra_pipelines.logs.validation_rules import resolve_rules
from aiinfra_pipelines.logs.validation_sensors import (
    check_channels,
    check_clock_sync,
    check_simulated_sensors,
    required_sensor_roles,
    with_clock,
)


def _camera_stats(scanned: ScannedLog) -> tuple[int, float, float | None]:
    times = np.array([m.log_time for m in scanned.messages.get(TOPIC_CAMERA, [])], np.int64)
    duration = float((times.max() - times.min()) / 1e9) if len(times) > 1 else 0.0
    return len(times), duration, rate_hz(times)


T = TypeVar("T")

# Raised by the frame builder for problems that check_channels has already reported.
_ALREADY_REPORTED = frozenset({errors.MISSING_CHANNEL, errors.WRONG_SCHEMA})


def _build(
    scanned: ScannedLog, metadata: dict, reasons: list[Reason], lazy: bool = False
) -> DriveLog | None:
    """The decoded log, or ``None`` (with a reason) when frames cannot be rebuilt."""
    try:
        return build_drive_log(scanned, metadata, lazy=lazy)
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


def _decoding(checks: Callable[[], T], reasons: list[Reason], default: T) -> T:
    """Run checks that decode frames; a frame that cannot be decoded is the reason (once).

    A lazy log (the streaming path) decodes its images while these checks read them, so a
    damaged JPEG mid-log surfaces here as ``bad_image`` rather than while the log is built.
    """
    try:
        return checks()
    except DriveLogError as exc:
        if not any(reason.code == exc.code for reason in reasons):
            reasons.append(Reason(exc.code, exc.message))
        return default


def _validate(
    data: Any,
    rules: dict[str, Any],
    anonymized: bool,
    source: str | None = None,
    streaming: bool = False,
) -> ValidationReport:
    try:
        scanned = scan_mcap(data, deferred=streaming)
    except DriveLogError as exc:
        return ValidationReport(accepted=False, reasons=[Reason(exc.code, exc.message)])
    try:
        profile = _choose_profile(scanned, source)
    except DriveLogError as exc:
        return ValidationReport(
            accepted=False,
            reasons=[Reason(exc.code, exc.message)],
            channels=scanned.channel_rows(),
        )
    report = (
        _validate_profiled(scanned, profile, rules, anonymized, streaming)
        if profile is not None and profile.name != SIMULATED_PROFILE
        else _validate_simulated(scanned, profile, rules, anonymized, streaming)
    )
    report.channels = scanned.channel_rows()
    return report


def _validate_simulated(
    scanned: ScannedLog,
    profile: SourceProfile | None,
    rules: dict[str, Any],
    anonymized: bool,
    streaming: bool = False,
) -> ValidationReport:
    """A file in the simulated fleet's layout (logs.reader)."""
    metadata, reasons = metadata_reasons(scanned, rules, anonymized)
    reasons = check_channels(scanned) + reasons
    log = _build(scanned, metadata, reasons, lazy=streaming)
    frame_count, duration, rate = _camera_stats(scanned)
    builder = ProfileLogBuilder(scanned, profile or load_profiles()[SIMULATED_PROFILE])
    sync: list[ClockSync] = []
    findings: list[PiiFinding] = []
    if log is not None:
        built = log
        reasons += _decoding(lambda: check_log_content(built, rules), reasons, [])
        sync = _decoding(
            lambda: check_simulated_sensors(builder, built, rules, reasons), reasons, []
        )
        pii_reasons, findings = _decoding(
            lambda: check_residual_pii(built, rules), reasons, ([], [])
        )
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
        sensors=with_clock(builder.sensors, sync),
        calibration_sha256=builder.calibration_sha256,
        pii_findings=findings,
        signal_sources=builder.declared_signal_sources(),
    )


def _recording_metadata(
    scanned: ScannedLog, profile: SourceProfile, anonymized: bool
) -> RecordingMetadata:
    """The profile's record completed by its derived map; an anonymized log's unknown VIN is
    its unknown pseudonym."""
    found = derive_metadata(profile, scanned)
    if anonymized and "vin" in found.derived:
        found.values[PSEUDONYM_KEY] = found.values.pop("vin")
        found.derived[PSEUDONYM_KEY] = found.derived.pop("vin")
    return found


def _validate_profiled(
    scanned: ScannedLog,
    profile: SourceProfile,
    rules: dict[str, Any],
    anonymized: bool,
    streaming: bool = False,
) -> ValidationReport:
    """A real car's recording: the profile's metadata (record and derived map), decoders and
    alignment. What the log does not carry is unknown (signals, derived metadata), reported
    with where everything else came from."""
    found = _recording_metadata(scanned, profile, anonymized)
    reasons: list[Reason] = []
    metadata = found.values
    builder = ProfileLogBuilder(scanned, profile, lazy=streaming)
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
    if not found.records and not profile.metadata_derived:
        reasons.insert(
            0, Reason(errors.MISSING_METADATA, f"no '{profile.metadata_record}' metadata record")
        )
    else:
        metadata, derived = fill_conditions(metadata, log, rules["conditions"])
        if log is not None:
            log.metadata.update(metadata)
        builder.derived_conditions.update(derived)
        reasons[:0] = check_metadata(metadata, rules, anonymized, found.unknown)
    reasons += [Reason(problem.code, problem.message) for problem in builder.problems]
    sync = clock_sync(builder.clock_offsets())
    reasons += check_clock_sync(sync, rules)
    findings: list[PiiFinding] = []
    if log is not None:
        built = log
        reasons += _decoding(lambda: check_log_content(built, rules), reasons, [])
        pii_reasons, findings = _decoding(
            lambda: check_residual_pii(built, rules), reasons, ([], [])
        )
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
        sensors=with_clock(builder.sensors, sync),
        derived_conditions=dict(builder.derived_conditions),
        calibration_sha256=builder.calibration_sha256,
        pii_findings=findings,
        signal_sources=dict(builder.signal_sources),
        derived_metadata=dict(found.derived),
    )


def validate_drive_log(
    data: bytes,
    rules: dict[str, Any] | None = None,
    *,
    anonymized: bool = False,
    source: str | None = None,
    streaming: bool = False,
) -> ValidationReport:
    """Validate one uploaded MCAP file (bytes; a path or stream also works).

    ``streaming=True`` (ingest; best with a path) keeps the memory bounded whatever the log's
    length: large payloads stay in the file (:mod:`.payloads`) and the report's ``log`` decodes
    each frame's images when the frame is read (:mod:`.lazy_frames`), so the file must stay
    readable while the log is used.

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
        return _validate(data, resolved, anonymized, source, streaming)
    except Exception as exc:  # the contract is "never raises", even for our own bugs
        return ValidationReport(
            accepted=False,
            reasons=[Reason("validation_error", plain(f"{type(exc).__name__}: {exc}"))],
        )
