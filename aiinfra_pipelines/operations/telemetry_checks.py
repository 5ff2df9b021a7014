"""Validation of one landed telemetry record: every problem, each as ``(code, message)``.

A record is checked field group by field group (identity, counts, latency, histogram and the
optional shadow, degradation and outbox figures) so that a rejected record carries every reason
at once; the codes are what the quarantine table and its asset check count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from aiinfra_pipelines.fleet.vehicles import is_valid_vin
from aiinfra_pipelines.vehicle.degradation import ALLOWED_TRANSITIONS, TRANSITION_CAUSES

from .outbox_telemetry import outbox_problems
from .telemetry_schema import (
    AT_FAULT_FIELD,
    COUNT_FIELDS,
    DEGRADATION_COUNTS,
    LATENCY_FIELDS,
    RECORD_FIELDS,
    SHA256_PATTERN,
    TEXT_FIELDS,
    TRANSITION_FIELDS,
)

if TYPE_CHECKING:
    from .telemetry import TelemetrySettings

Problems = list[tuple[str, str]]


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.number) and not isinstance(value, bool)


def check_record(record: Any, settings: TelemetrySettings) -> Problems:
    """Every problem of one landed record as ``(code, message)``; empty when it is valid."""
    if not isinstance(record, Mapping):
        return [("not_a_record", f"expected an object, got {type(record).__name__}")]
    frames_problems = _frames_problems(record, settings)
    frames = None if frames_problems else record.get("frames")  # checked against when valid
    return [
        *_identity_problems(record, settings),
        *frames_problems,
        *_count_problems(record, frames),
        *_latency_problems(record, settings),
        *_shadow_problems(record),
        *_degradation_problems(record, frames),
        *outbox_problems(record),
        *_histogram_problems(record, settings, frames),
    ]


def _identity_problems(record: Mapping[str, Any], settings: TelemetrySettings) -> Problems:
    """Required fields present; who sent it, with which engine, in which cohort, and when."""
    problems: Problems = []
    missing = [name for name in RECORD_FIELDS if name not in record]
    if missing:
        problems.append(("missing_field", f"missing field(s): {', '.join(missing)}"))
    for name in TEXT_FIELDS:
        if name in record and (not isinstance(record[name], str) or not record[name].strip()):
            problems.append(("invalid_field", f"{name} must be a non-empty string"))
    vin = record.get("vin")
    if isinstance(vin, str) and vin.strip() and not is_valid_vin(vin.strip().upper()):
        problems.append(("invalid_vin", "vin is not a valid ISO 3779 VIN"))
    engine = record.get("engine_sha256")
    if "engine_sha256" in record and not (
        isinstance(engine, str) and (engine == "" or SHA256_PATTERN.match(engine))
    ):
        problems.append(("invalid_engine_sha256", "engine_sha256 must be 64 lowercase hex or ''"))
    cohort = record.get("cohort")
    if isinstance(cohort, str) and cohort.strip() and cohort not in settings.cohorts:
        problems.append(("invalid_cohort", f"cohort {cohort!r} not in {list(settings.cohorts)}"))
    return problems + _recorded_at_problems(record.get("recorded_at"))


def _recorded_at_problems(recorded_at: Any) -> Problems:
    if not (isinstance(recorded_at, str) and recorded_at.strip()):
        return []  # a missing or empty one is already reported as a field problem
    try:
        if datetime.fromisoformat(recorded_at).tzinfo is None:
            return [("invalid_recorded_at", "recorded_at has no UTC offset")]
    except ValueError:
        return [("invalid_recorded_at", f"recorded_at {recorded_at!r} is not ISO-8601")]
    return []


def _frames_problems(record: Mapping[str, Any], settings: TelemetrySettings) -> Problems:
    frames = record.get("frames")
    if "frames" in record and (not _is_int(frames) or not 0 < frames <= settings.max_frames):
        return [("invalid_frames", f"frames must be an integer in 1..{settings.max_frames}")]
    return []


def _count_problems(record: Mapping[str, Any], frames: Any) -> Problems:
    """Event counts are non-negative and fit inside each other (events within frames)."""
    problems: Problems = [
        ("invalid_count", f"{name} must be a non-negative integer")
        for name in COUNT_FIELDS
        if name in record and (not _is_int(record[name]) or record[name] < 0)
    ]
    at_fault = record.get(AT_FAULT_FIELD)
    if AT_FAULT_FIELD in record and (not _is_int(at_fault) or at_fault < 0):
        problems.append(("invalid_count", f"{AT_FAULT_FIELD} must be a non-negative integer"))
    elif (
        _is_int(at_fault)
        and _is_int(collisions := record.get("collisions"))
        and (at_fault > collisions)
    ):
        problems.append(("inconsistent_counts", f"{AT_FAULT_FIELD} exceeds collisions"))
    if frames is None or not _is_int(record.get("fallback_frames")):
        return problems
    if record["fallback_frames"] > frames:
        problems.append(("inconsistent_counts", "fallback_frames exceeds frames"))
    if _is_int(record.get("fallback_events")) and (
        record["fallback_events"] > record["fallback_frames"]
    ):
        problems.append(("inconsistent_counts", "fallback_events exceeds fallback_frames"))
    return problems


def _latency_problems(record: Mapping[str, Any], settings: TelemetrySettings) -> Problems:
    if not all(name in record for name in LATENCY_FIELDS):
        return []  # a missing percentile is already reported as a missing field
    latencies = [record[name] for name in LATENCY_FIELDS]
    if not all(_is_number(v) and math.isfinite(v) for v in latencies):
        return [("invalid_latency", "latency percentiles must be finite numbers")]
    if not 0.0 <= latencies[0] <= latencies[1] <= latencies[2] <= settings.max_latency_ms:
        return [
            (
                "invalid_latency",
                f"latencies must satisfy 0 <= p50 <= p95 <= p99 <= "
                f"{settings.max_latency_ms:g} ms, got {latencies}",
            )
        ]
    return []


def _histogram_problems(
    record: Mapping[str, Any], settings: TelemetrySettings, frames: Any
) -> Problems:
    """The confidence histogram has the configured bins and counts every frame once."""
    if "confidence_histogram" not in record:
        return []
    histogram = record["confidence_histogram"]
    if (
        not isinstance(histogram, list | tuple)
        or len(histogram) != settings.confidence_bins
        or not all(_is_int(c) and c >= 0 for c in histogram)
    ):
        return [
            (
                "invalid_histogram",
                f"confidence_histogram must be {settings.confidence_bins} non-negative integers",
            )
        ]
    if frames is not None and sum(histogram) != frames:
        return [("invalid_histogram", f"confidence_histogram counts {sum(histogram)} != frames")]
    return []


def _shadow_problems(record: Mapping[str, Any]) -> Problems:
    """The optional shadow-mode fields, when present, are consistent."""
    problems: Problems = []
    shadow = record.get("shadow_engine_sha256", "")
    if not (isinstance(shadow, str) and (shadow == "" or SHA256_PATTERN.match(shadow))):
        problems.append(
            ("invalid_engine_sha256", "shadow_engine_sha256 must be 64 lowercase hex or ''")
        )
    frames, agreements = record.get("shadow_frames", 0), record.get("shadow_agreements", 0)
    if not (_is_int(frames) and _is_int(agreements) and 0 <= agreements <= frames):
        problems.append(
            ("invalid_count", "shadow_agreements must be an integer in 0..shadow_frames")
        )
    elif frames and not shadow:
        problems.append(("inconsistent_counts", "shadow_frames without shadow_engine_sha256"))
    return problems


def _degradation_problems(record: Mapping[str, Any], frames: Any) -> Problems:
    """The optional degradation fields, when present: counts within the frames, transitions
    the state machine can make, for causes it knows."""
    problems: Problems = []
    counts = {name: record.get(name, 0) for name in DEGRADATION_COUNTS}
    for name, value in counts.items():
        if not _is_int(value) or value < 0:
            problems.append(("invalid_count", f"{name} must be a non-negative integer"))
    if frames is not None and all(_is_int(v) for v in counts.values()):
        outside = counts["degraded_frames"] + counts["minimal_risk_frames"]
        if max(outside, counts["engine_errors"]) > frames:
            problems.append(("inconsistent_counts", "degradation frames exceed frames"))
    transitions = record.get("degradation_transitions", [])
    if not isinstance(transitions, list | tuple):
        return [*problems, ("invalid_transition", "degradation_transitions must be a list")]
    for index, transition in enumerate(transitions):
        problem = _transition_problem(transition)
        if problem:
            problems.append(("invalid_transition", f"degradation_transitions[{index}]: {problem}"))
    return problems


def _transition_problem(transition: Any) -> str:
    """Why one reported transition is not one the state machine can make ("" if it is)."""
    if not isinstance(transition, Mapping) or set(transition) != set(TRANSITION_FIELDS):
        return f"must have exactly the fields {list(TRANSITION_FIELDS)}"
    names = ("from_state", "to_state", "cause", "detail")
    if not all(isinstance(transition[name], str) for name in names):
        return f"{', '.join(names)} must be strings"
    if (transition["from_state"], transition["to_state"]) not in ALLOWED_TRANSITIONS:
        return f"no transition {transition['from_state']!r} -> {transition['to_state']!r}"
    if transition["cause"] not in TRANSITION_CAUSES:
        return f"unknown cause {transition['cause']!r}"
    offset = transition["offset_s"]
    if not (_is_number(offset) and math.isfinite(offset) and offset >= 0):
        return "offset_s must be a finite number >= 0"
    return ""
