"""Fleet telemetry: the vehicle-side aggregate record, its validation and its published form.

A car cannot upload every frame, but it can report what its engine did: one record per drive
(or reporting window) with the engine it ran, how many frames it perceived, inference latency
percentiles, a confidence histogram, fallback frames and activations, near misses, collisions
and hard brakes. Records land like drive logs (raw, with the VIN, on ``ingest-<batch>``
branches); ``fleet_telemetry`` validates them, quarantines bad ones with every reason, replaces
the VIN with the keyed pseudonym and publishes the rest to ``main``, where rollout compares the
candidate cohort with the control cohort and the drift monitor reads confidences.

Landed record (JSON object or Parquet row)::

    record_id            str   unique per vehicle and window (may contain the VIN: it is
                               replaced by a keyed hash before publishing)
    vin                  str   ISO 3779, 17 characters
    vehicle_model        str
    software_version     str   what the car reports it runs (model version or planner id)
    engine_sha256        str   SHA-256 of the perception engine it ran ("" = none: ground truth)
    cohort               str   the OTA assignment it reports (operations.yaml ``cohorts``)
    recorded_at          str   ISO-8601 with UTC offset: start of the window
    frames               int   frames perceived (one per planner decision)
    latency_ms_p50/_p95/_p99  float  inference latency percentiles
    confidence_histogram list[int]  per-frame confidence counts, operations.yaml bins on [0, 1]
    fallback_frames      int   frames the planner spent in low-confidence fallback
    fallback_events      int   times it entered fallback
    near_misses, collisions, hard_brakes   int
    shadow_engine_sha256 str   optional: the engine run in shadow mode ("" = none)
    shadow_frames        int   optional: frames it perceived and planned on without acting
    shadow_agreements    int   optional: of those, frames whose shadow plan matched the driven one
    degraded_frames      int   optional: frames the degradation state machine spent in degraded
    minimal_risk_frames  int   optional: ... and in minimal_risk
    engine_errors        int   optional: frames on which the engine raised
    degradation_transitions  list  optional: every state transition, each {offset_s (seconds
                               after recorded_at), from_state, to_state, cause, detail}

    outbox_*             optional: the car's outbox at send time (operations.outbox_telemetry):
                               backlog logs/bytes, held logs, evictions, pulls served and
                               unservable, bytes sent by priority class ({class: bytes})

Published rows drop ``vin`` and gain ``vehicle_pseudonym``, ``batch_id``, ``source_commit`` and
``source_key``; ``record_id`` is replaced by its keyed hash; ``degradation_transitions`` and
``outbox_bytes_sent_by_class`` are published as JSON text (one Parquet column of any length).
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.fleet.vehicles import is_valid_vin
from aiinfra_pipelines.logs.anonymize import pseudonymize_vin
from aiinfra_pipelines.vehicle.degradation import ALLOWED_TRANSITIONS, TRANSITION_CAUSES

from .outbox_telemetry import OUTBOX_DEFAULTS, outbox_fields, outbox_problems, published_outbox

COUNT_FIELDS = ("fallback_frames", "fallback_events", "near_misses", "collisions", "hard_brakes")
LATENCY_FIELDS = ("latency_ms_p50", "latency_ms_p95", "latency_ms_p99")
TEXT_FIELDS = ("record_id", "vin", "vehicle_model", "software_version", "cohort", "recorded_at")
RECORD_FIELDS = (
    *TEXT_FIELDS,
    "engine_sha256",
    "frames",
    *LATENCY_FIELDS,
    "confidence_histogram",
    *COUNT_FIELDS,
)
# Optional fields (older agents do not send them) with the value a missing one means.
SHADOW_DEFAULTS: dict[str, Any] = {  # release.shadow.shadow_agreement summarizes them
    "shadow_engine_sha256": "",
    "shadow_frames": 0,
    "shadow_agreements": 0,
}
# The degradation state machine's figures (vehicle.degradation); optional like shadow's.
DEGRADATION_DEFAULTS: dict[str, Any] = {
    "degraded_frames": 0,
    "minimal_risk_frames": 0,
    "engine_errors": 0,
    "degradation_transitions": [],
}
TRANSITION_FIELDS = ("offset_s", "from_state", "to_state", "cause", "detail")
DEGRADATION_COUNTS = ("degraded_frames", "minimal_risk_frames", "engine_errors")
PUBLISHED_COLUMNS = (
    "record_id",
    "vehicle_pseudonym",
    "vehicle_model",
    "software_version",
    "engine_sha256",
    "cohort",
    "recorded_at",
    "frames",
    *LATENCY_FIELDS,
    "confidence_histogram",
    *COUNT_FIELDS,
    *SHADOW_DEFAULTS,
    *DEGRADATION_DEFAULTS,
    *OUTBOX_DEFAULTS,
    "batch_id",
    "source_commit",
    "source_key",
)
QUARANTINE_COLUMNS = (
    "batch_id",
    "source_commit",
    "source_key",
    "record_index",
    "vehicle_pseudonym",
    "reason_codes",
    "reasons",
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class TelemetrySettings:
    """``resources/operations.yaml`` → ``telemetry``."""

    upload_prefix: str
    confidence_bins: int
    cohorts: tuple[str, ...]
    near_miss_ttc_s: float
    near_miss_gap_m: float
    max_frames: int
    max_latency_ms: float
    quarantine_listed: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> TelemetrySettings:
        section = (config or load_resource_yaml("operations.yaml"))["telemetry"]
        return cls(
            upload_prefix=str(section["upload_prefix"]),
            confidence_bins=int(section["confidence_bins"]),
            cohorts=tuple(str(c) for c in section["cohorts"]),
            near_miss_ttc_s=float(section["near_miss_ttc_s"]),
            near_miss_gap_m=float(section["near_miss_gap_m"]),
            max_frames=int(section["limits"]["max_frames"]),
            max_latency_ms=float(section["limits"]["max_latency_ms"]),
            quarantine_listed=int(section["quarantine_listed"]),
        )

    @property
    def confidence_edges(self) -> np.ndarray:
        return np.linspace(0.0, 1.0, self.confidence_bins + 1)


class TelemetryFormatError(ValueError):
    """An uploaded telemetry file could not be read as records at all."""


# ---------------------------------------------------------------------------------- building
def confidence_histogram(confidences: Sequence[float], bins: int) -> list[int]:
    """Counts of per-frame confidences in ``bins`` equal bins on [0, 1] (1.0 in the last)."""
    values = np.clip(np.asarray(confidences, dtype=float), 0.0, 1.0)
    index = np.minimum((values * bins).astype(np.int64), bins - 1)
    return [int(count) for count in np.bincount(index, minlength=bins)]


def telemetry_record(
    *,
    record_id: str,
    vin: str,
    vehicle_model: str,
    software_version: str,
    engine_sha256: str,
    cohort: str,
    recorded_at: str,
    latencies_ms: Sequence[float],
    confidences: Sequence[float],
    fallback_flags: Sequence[bool] | None = None,
    fallback_counts: tuple[int, int] | None = None,
    near_misses: int = 0,
    collisions: int = 0,
    hard_brakes: int = 0,
    shadow: tuple[str, int, int] | None = None,
    degradation: Mapping[str, Any] | None = None,
    outbox: Mapping[str, Any] | None = None,
    settings: TelemetrySettings | None = None,
) -> dict[str, Any]:
    """One vehicle-side record from per-frame series, as a car's telemetry agent builds it.

    ``outbox`` is the car's outbox snapshot (``vehicle.outbox.Outbox.status()``) when it
    reports one (``operations.outbox_telemetry``).

    ``shadow`` is (engine sha256, frames, agreeing frames) when an engine ran in shadow mode;
    ``degradation`` holds the :data:`DEGRADATION_DEFAULTS` fields when the car reports them.

    Fallback comes either as per-frame ``fallback_flags`` or, where only totals are known, as
    ``fallback_counts`` = (fallback frames, fallback activations).
    """
    settings = settings or TelemetrySettings.load()
    latencies = np.asarray(latencies_ms, dtype=float)
    if fallback_counts is not None:
        fallback_frames, onsets = (int(count) for count in fallback_counts)
    else:
        flags = np.asarray(fallback_flags if fallback_flags is not None else [], dtype=bool)
        fallback_frames = int(flags.sum())
        onsets = int(np.sum(flags & ~np.concatenate([[False], flags[:-1]]))) if flags.size else 0
    percentiles = np.percentile(latencies, [50, 95, 99]) if latencies.size else np.zeros(3)
    return {
        "record_id": record_id,
        "vin": vin,
        "vehicle_model": vehicle_model,
        "software_version": software_version,
        "engine_sha256": engine_sha256,
        "cohort": cohort,
        "recorded_at": recorded_at,
        "frames": len(confidences),
        "latency_ms_p50": round(float(percentiles[0]), 4),
        "latency_ms_p95": round(float(percentiles[1]), 4),
        "latency_ms_p99": round(float(percentiles[2]), 4),
        "confidence_histogram": confidence_histogram(confidences, settings.confidence_bins),
        "fallback_frames": fallback_frames,
        "fallback_events": onsets,
        "near_misses": int(near_misses),
        "collisions": int(collisions),
        "hard_brakes": int(hard_brakes),
        **(
            {
                "shadow_engine_sha256": shadow[0],
                "shadow_frames": int(shadow[1]),
                "shadow_agreements": int(shadow[2]),
            }
            if shadow is not None
            else {}
        ),
        **(
            {name: degradation.get(name, default) for name, default in DEGRADATION_DEFAULTS.items()}
            if degradation is not None
            else {}
        ),
        **(outbox_fields(outbox) if outbox is not None else {}),
    }


def record_from_episode(
    metrics: Any,
    *,
    vin: str,
    vehicle_model: str,
    software_version: str,
    cohort: str,
    recorded_at: str,
    record_id: str,
    outbox: Mapping[str, Any] | None = None,
    settings: TelemetrySettings | None = None,
) -> dict[str, Any]:
    """A record from one closed-loop episode (``fleet.closed_loop.EpisodeMetrics`` or its dict).

    Latency is the per-step perception time; a near miss is an episode without collision whose
    minimum TTC or bumper gap fell below the operations.yaml thresholds. Every degradation
    transition goes with its offset from the episode's start and its cause.
    """
    settings = settings or TelemetrySettings.load()
    m = metrics.to_dict() if hasattr(metrics, "to_dict") else dict(metrics)
    ttc, gap = m.get("min_ttc_s"), m.get("min_lead_gap_m")
    near = (ttc is not None and ttc < settings.near_miss_ttc_s) or (
        gap is not None and gap < settings.near_miss_gap_m
    )
    return telemetry_record(
        record_id=record_id,
        vin=vin,
        vehicle_model=vehicle_model,
        software_version=software_version,
        engine_sha256=str(m.get("engine_sha256") or ""),
        cohort=cohort,
        recorded_at=recorded_at,
        latencies_ms=list(m.get("perception_ms") or []),
        confidences=list(m["confidence"]),
        fallback_counts=(int(m["fallback_steps"]), int(m["fallback_activations"])),
        near_misses=int(near and not m["collision"]),
        collisions=int(bool(m["collision"])),
        hard_brakes=int(m["hard_brakes"]),
        shadow=(
            (m["shadow_engine_sha256"], int(m["shadow_steps"]), int(m["shadow_agreements"]))
            if m.get("shadow_engine_sha256")
            else None
        ),
        degradation=_episode_degradation(m),
        outbox=outbox,
        settings=settings,
    )


def _episode_degradation(m: Mapping[str, Any]) -> dict[str, Any]:
    transitions = [
        {
            "offset_s": round(int(t["timestamp_ns"]) / 1e9, 6),
            **{name: str(t[name]) for name in TRANSITION_FIELDS[1:]},
        }
        for t in m.get("degradation_transitions") or []
    ]
    return {
        "degraded_frames": int(m.get("degraded_steps") or 0),
        "minimal_risk_frames": int(m.get("minimal_risk_steps") or 0),
        "engine_errors": int(m.get("engine_errors") or 0),
        "degradation_transitions": transitions,
    }


# ----------------------------------------------------------------------------------- parsing
def parse_upload(key: str, data: bytes) -> list[dict[str, Any]]:
    """Records of one uploaded file: ``.json`` (a list, or ``{"records": [...]}``), ``.jsonl``
    (one object per line) or ``.parquet``. Raises :class:`TelemetryFormatError` naming the file.
    """
    try:
        if key.endswith(".parquet"):
            table = pd.read_parquet(io.BytesIO(data))
            return [_plain(row) for row in table.to_dict(orient="records")]
        if key.endswith(".jsonl"):
            return [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        if key.endswith(".json"):
            parsed = json.loads(data)
            if isinstance(parsed, dict) and isinstance(parsed.get("records"), list):
                parsed = parsed["records"]
            if not isinstance(parsed, list):
                raise TelemetryFormatError(
                    f"{key}: expected a JSON list of records or {{'records': [...]}}, "
                    f"got {type(parsed).__name__}"
                )
            return parsed
    except TelemetryFormatError:
        raise
    except Exception as error:  # any decoder's failure means the same: unreadable upload
        raise TelemetryFormatError(f"{key}: unreadable ({type(error).__name__}: {error})") from None
    raise TelemetryFormatError(f"{key}: unknown telemetry file type (.json, .jsonl or .parquet)")


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    """A Parquet row with numpy values turned into plain Python ones."""
    out: dict[str, Any] = {}
    for name, value in row.items():
        if isinstance(value, np.ndarray):
            out[name] = value.tolist()
        elif isinstance(value, np.generic):
            out[name] = value.item()
        else:
            out[name] = value
    return out


# -------------------------------------------------------------------------------- validation
def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.number) and not isinstance(value, bool)


def check_record(record: Any, settings: TelemetrySettings) -> list[tuple[str, str]]:
    """Every problem of one landed record as ``(code, message)``; empty when it is valid."""
    if not isinstance(record, Mapping):
        return [("not_a_record", f"expected an object, got {type(record).__name__}")]
    problems: list[tuple[str, str]] = []
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
        isinstance(engine, str) and (engine == "" or _SHA256.match(engine))
    ):
        problems.append(("invalid_engine_sha256", "engine_sha256 must be 64 lowercase hex or ''"))
    cohort = record.get("cohort")
    if isinstance(cohort, str) and cohort.strip() and cohort not in settings.cohorts:
        problems.append(("invalid_cohort", f"cohort {cohort!r} not in {list(settings.cohorts)}"))
    recorded_at = record.get("recorded_at")
    if isinstance(recorded_at, str) and recorded_at.strip():
        try:
            if datetime.fromisoformat(recorded_at).tzinfo is None:
                problems.append(("invalid_recorded_at", "recorded_at has no UTC offset"))
        except ValueError:
            problems.append(("invalid_recorded_at", f"recorded_at {recorded_at!r} is not ISO-8601"))
    frames = record.get("frames")
    if "frames" in record and (not _is_int(frames) or not 0 < frames <= settings.max_frames):
        problems.append(
            ("invalid_frames", f"frames must be an integer in 1..{settings.max_frames}")
        )
        frames = None
    for name in COUNT_FIELDS:
        if name in record and (not _is_int(record[name]) or record[name] < 0):
            problems.append(("invalid_count", f"{name} must be a non-negative integer"))
    if frames is not None and _is_int(record.get("fallback_frames")):
        if record["fallback_frames"] > frames:
            problems.append(("inconsistent_counts", "fallback_frames exceeds frames"))
        if _is_int(record.get("fallback_events")) and (
            record["fallback_events"] > record["fallback_frames"]
        ):
            problems.append(("inconsistent_counts", "fallback_events exceeds fallback_frames"))
    latencies = [record.get(name) for name in LATENCY_FIELDS]
    if all(name in record for name in LATENCY_FIELDS):
        if not all(_is_number(v) and math.isfinite(v) for v in latencies):
            problems.append(("invalid_latency", "latency percentiles must be finite numbers"))
        elif not 0.0 <= latencies[0] <= latencies[1] <= latencies[2] <= settings.max_latency_ms:
            problems.append(
                (
                    "invalid_latency",
                    f"latencies must satisfy 0 <= p50 <= p95 <= p99 <= "
                    f"{settings.max_latency_ms:g} ms, got {latencies}",
                )
            )
    problems += _shadow_problems(record)
    problems += _degradation_problems(record, frames)
    problems += outbox_problems(record)
    histogram = record.get("confidence_histogram")
    if "confidence_histogram" in record:
        if (
            not isinstance(histogram, list | tuple)
            or len(histogram) != settings.confidence_bins
            or not all(_is_int(c) and c >= 0 for c in histogram)
        ):
            problems.append(
                (
                    "invalid_histogram",
                    f"confidence_histogram must be {settings.confidence_bins} non-negative "
                    "integers",
                )
            )
        elif frames is not None and sum(histogram) != frames:
            problems.append(
                ("invalid_histogram", f"confidence_histogram counts {sum(histogram)} != frames")
            )
    return problems


def _shadow_problems(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The optional shadow-mode fields, when present, are consistent."""
    problems: list[tuple[str, str]] = []
    shadow = record.get("shadow_engine_sha256", "")
    if not (isinstance(shadow, str) and (shadow == "" or _SHA256.match(shadow))):
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


def _degradation_problems(record: Mapping[str, Any], frames: Any) -> list[tuple[str, str]]:
    """The optional degradation fields, when present: counts within the frames, transitions
    the state machine can make, for causes it knows."""
    problems: list[tuple[str, str]] = []
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


@dataclass(frozen=True)
class ValidatedBatch:
    """A batch split into publishable rows and quarantine rows (one per rejected record)."""

    accepted: pd.DataFrame
    quarantined: pd.DataFrame

    @property
    def reason_counts(self) -> dict[str, int]:
        if self.quarantined.empty:
            return {}
        codes = self.quarantined["reason_codes"].str.split(",").explode()
        return {str(k): int(v) for k, v in codes.value_counts().sort_index().items()}


def hashed_record_id(record_id: str, key: bytes) -> str:
    """The published id of a record: keyed hash (a raw id may embed the VIN)."""
    return "tel-" + hmac.new(key, record_id.encode(), hashlib.sha256).hexdigest()[:24]


def validate_uploads(
    uploads: Iterable[tuple[str, bytes]],
    *,
    batch_id: str,
    source_commit: str,
    key: bytes,
    settings: TelemetrySettings | None = None,
) -> ValidatedBatch:
    """Parse, check and pseudonymize every record of a batch's upload files.

    An unreadable file becomes one quarantine row (``record_index`` -1); a record that fails
    any check, or repeats an earlier ``record_id``, one row with every reason. No VIN and no
    raw record id reaches either table.
    """
    settings = settings or TelemetrySettings.load()
    accepted: list[dict[str, Any]] = []
    quarantined: list[dict[str, Any]] = []
    seen: set[str] = set()

    def reject(source_key: str, index: int, record: Any, problems: list[tuple[str, str]]):
        vin = record.get("vin") if isinstance(record, Mapping) else None
        quarantined.append(
            {
                "batch_id": batch_id,
                "source_commit": source_commit,
                "source_key": source_key,
                "record_index": index,
                "vehicle_pseudonym": (
                    pseudonymize_vin(vin, key) if isinstance(vin, str) and vin.strip() else ""
                ),
                "reason_codes": ",".join(dict.fromkeys(code for code, _ in problems)),
                "reasons": json.dumps([{"code": c, "message": m} for c, m in problems]),
            }
        )

    for source_key, data in uploads:
        try:
            records = parse_upload(source_key, data)
        except TelemetryFormatError as error:
            reject(source_key, -1, None, [("unreadable_upload", str(error))])
            continue
        for index, record in enumerate(records):
            problems = check_record(record, settings)
            if not problems and record["record_id"] in seen:
                problems = [("duplicate_record_id", "record_id repeats an earlier record")]
            if problems:
                reject(source_key, index, record, problems)
                continue
            seen.add(record["record_id"])
            row = {name: record[name] for name in RECORD_FIELDS if name != "vin"}
            row.update(
                {name: record.get(name, default) for name, default in SHADOW_DEFAULTS.items()}
            )
            row.update(
                {name: record.get(name, default) for name, default in DEGRADATION_DEFAULTS.items()}
            )
            row.update(published_outbox(record))
            row["degradation_transitions"] = json.dumps(
                [dict(t) for t in row["degradation_transitions"]], sort_keys=True
            )
            row["record_id"] = hashed_record_id(record["record_id"], key)
            row["vehicle_pseudonym"] = pseudonymize_vin(record["vin"], key)
            row["confidence_histogram"] = [int(c) for c in record["confidence_histogram"]]
            row.update(batch_id=batch_id, source_commit=source_commit, source_key=source_key)
            accepted.append(row)
    return ValidatedBatch(
        accepted=pd.DataFrame(accepted, columns=list(PUBLISHED_COLUMNS)).astype(
            {name: "float64" for name in LATENCY_FIELDS}
        ),
        quarantined=pd.DataFrame(quarantined, columns=list(QUARANTINE_COLUMNS)),
    )


def telemetry_summary(accepted: pd.DataFrame) -> pd.DataFrame:
    """Per vehicle model × software version: vehicles, frames, fallback, latency, confidence."""
    columns = [
        "vehicle_model",
        "software_version",
        "vehicles",
        "frames",
        "fallback_rate",
        "latency_ms_p95",
        "mean_confidence",
        "near_misses",
        "collisions",
    ]
    if accepted.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for (model, version), part in accepted.groupby(["vehicle_model", "software_version"]):
        histogram = np.sum(np.stack([np.asarray(h) for h in part["confidence_histogram"]]), axis=0)
        centres = (np.arange(len(histogram)) + 0.5) / len(histogram)
        frames = int(part["frames"].sum())
        rows.append(
            {
                "vehicle_model": model,
                "software_version": version,
                "vehicles": int(part["vehicle_pseudonym"].nunique()),
                "frames": frames,
                "fallback_rate": round(float(part["fallback_frames"].sum() / frames), 4),
                "latency_ms_p95": round(
                    float(np.average(part["latency_ms_p95"], weights=part["frames"])), 3
                ),
                "mean_confidence": round(float(np.sum(histogram * centres) / histogram.sum()), 4),
                "near_misses": int(part["near_misses"].sum()),
                "collisions": int(part["collisions"].sum()),
            }
        )
    return pd.DataFrame(rows, columns=columns)
