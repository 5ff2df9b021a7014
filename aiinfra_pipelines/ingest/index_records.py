"""Ingesting a car's index record: scene-index rows for a segment whose raw log stayed on the car.

The record (``vehicle.index_only``) carries the log's metadata, each frame's signals and a
thumbnail. It is held to the same contract as a log's metadata and signals, anonymized the
same way (VIN → pseudonym, GPS coarsened), and indexed with ``raw_available = False`` and no
frames object: it can be queried and pulled, never trained on.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.logs.anonymize import (
    anonymize_metadata,
    coarsen_coordinate,
    default_gps_decimals,
)
from aiinfra_pipelines.logs.reader import rate_hz
from aiinfra_pipelines.logs.validation_content import check_signal, check_timing
from aiinfra_pipelines.logs.validation_metadata import check_metadata
from aiinfra_pipelines.logs.validation_report import Reason
from aiinfra_pipelines.logs.validation_rules import resolve_rules
from aiinfra_pipelines.vehicle.index_only import FRAME_SIGNALS, INDEX_RECORD_KIND

from .tables import scene_index_table, trigger_rule_names
from .verdicts import NOTICE, QUARANTINED

BAD_INDEX_RECORD = "bad_index_record"
BAD_PULL_NOTICE = "bad_pull_notice"
BOUNDED_SIGNALS = ("speed_mps", "accel_mps2", "steering_rad", "brake", "latitude", "longitude")


def parse_index_record(data: bytes) -> tuple[dict[str, Any] | None, list[Reason]]:
    """The record, or ``None`` and why it cannot be read."""
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        return None, [Reason(BAD_INDEX_RECORD, f"not JSON: {exc}")]
    if not isinstance(record, dict) or record.get("kind") != INDEX_RECORD_KIND:
        return None, [Reason(BAD_INDEX_RECORD, f"not an {INDEX_RECORD_KIND} object")]
    frames = record.get("frames")
    if not isinstance(frames, list) or not frames or not all(isinstance(f, dict) for f in frames):
        return None, [Reason(BAD_INDEX_RECORD, "frames must be a non-empty list of objects")]
    fields = (*FRAME_SIGNALS, "vehicles_in_view")
    missing = sorted({name for frame in frames for name in fields if name not in frame})
    if not isinstance(record.get("metadata"), dict) or missing:
        return None, [Reason(BAD_INDEX_RECORD, f"metadata or frame fields missing: {missing}")]
    not_numbers = sorted(
        {name for frame in frames for name in fields if not _is_number(frame[name])}
    )
    if not_numbers:
        return None, [Reason(BAD_INDEX_RECORD, f"frame fields that are not numbers: {not_numbers}")]
    events = record.get("events", [])
    if not isinstance(events, list) or not all(
        isinstance(e, list) and len(e) == 2 and _is_number(e[0]) and isinstance(e[1], str)
        for e in events
    ):
        return None, [Reason(BAD_INDEX_RECORD, "events must be [timestamp_ns, rule] pairs")]
    return record, []


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def validate_index_record(record: dict[str, Any]) -> list[Reason]:
    """The log contract's metadata, timing and signal checks, on the record's frames."""
    rules = resolve_rules()
    frames = pd.DataFrame(record["frames"])
    reasons = check_metadata({k: str(v) for k, v in record["metadata"].items()}, rules)
    reasons += check_timing(frames["timestamp_ns"].astype(np.int64).tolist(), rules)
    for name in BOUNDED_SIGNALS:
        values = pd.to_numeric(frames[name], errors="coerce").to_numpy(dtype=np.float64)
        reasons += check_signal(name, values, rules["ranges"].get(name))
    return reasons


def anonymized_index_frames(record: dict[str, Any], key: bytes) -> tuple[dict, pd.DataFrame]:
    """The record's metadata (VIN → pseudonym) and frames (GPS coarsened), as ingest does."""
    metadata = anonymize_metadata({k: str(v) for k, v in record["metadata"].items()}, key)
    decimals = default_gps_decimals()
    frames = pd.DataFrame(record["frames"])
    frames.insert(0, "frame_index", np.arange(len(frames)))
    for column in ("latitude", "longitude"):
        frames[column] = [coarsen_coordinate(float(v), decimals) for v in frames[column]]
    return metadata, frames


def ingest_index_record(outcome: Any, data: bytes, key: bytes) -> Any:
    """Judge and index one index record into ``outcome`` (a ``batch.LogOutcome``).

    Never raises for bad data: whatever goes wrong with one record quarantines that record
    (``bad_index_record``), not its batch.
    """
    outcome.kind = "index"
    try:
        return _ingest_index_record(outcome, data, key)
    except Exception as exc:  # one upload must not stop its batch, whatever it holds
        outcome.verdict = QUARANTINED
        outcome.index = None
        outcome.reasons = [(BAD_INDEX_RECORD, f"{type(exc).__name__}: {exc}")]
        return outcome


def _ingest_index_record(outcome: Any, data: bytes, key: bytes) -> Any:
    record, reasons = parse_index_record(data)
    if record is not None:
        reasons = validate_index_record(record)
    if record is None or reasons:
        outcome.verdict = QUARANTINED
        outcome.reasons = [(reason.code, reason.message) for reason in reasons]
        return outcome
    metadata, frames = anonymized_index_frames(record, key)
    times = frames["timestamp_ns"].to_numpy(dtype=np.int64)
    outcome.frames = len(frames)
    outcome.duration_s = float((times[-1] - times[0]) / 1e9) if len(times) > 1 else 0.0
    outcome.frame_rate_hz = float(rate_hz(times) or 0.0)
    outcome.log_id = str(metadata.get("log_id", ""))
    outcome.index = scene_index_table(
        frames,
        tags=metadata,
        events=[(int(ts), str(rule)) for ts, rule in record.get("events", [])],
        rule_names=trigger_rule_names(),
        source_branch=outcome.location.branch,
        source_commit=outcome.source_commit,
        log_key=outcome.location.key,
        frames_object="",
        raw_available=False,
        # The raw log the car still holds (what a pull would deliver), not the index record.
        log_sha256=str(record.get("raw_sha256") or ""),
    )
    outcome.slice = str(outcome.index["slice"].iloc[0]) if len(outcome.index) else ""
    return outcome


def read_pull_notice(outcome: Any, data: bytes) -> Any:
    """A car's notice that it cannot serve a pull: kept on the outcome to close the request."""
    outcome.kind = "notice"
    try:
        notice = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        notice = None
        problem = f"not JSON: {exc}"
    else:
        problem = "" if isinstance(notice, dict) and notice.get("log_id") else "no log_id"
    if notice is None or problem:
        outcome.verdict = QUARANTINED
        outcome.reasons = [(BAD_PULL_NOTICE, f"unreadable pull notice: {problem}")]
        return outcome
    outcome.verdict = NOTICE
    outcome.log_id = str(notice["log_id"])
    outcome.notice = notice
    return outcome
