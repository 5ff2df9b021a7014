"""The cloud side of fleet telemetry: landed upload files parsed into records, each record
checked (:mod:`.telemetry_checks`), the valid ones pseudonymized for publishing and the rest
quarantined with every reason, and the published rows summarized.

Apart from :mod:`.telemetry`, which builds a record the way a car's agent does, because this
is the only side that sees raw VINs and must never let one through.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.logs.anonymize import pseudonymize_vin

from .outbox_telemetry import published_outbox
from .telemetry import TelemetrySettings
from .telemetry_checks import check_record
from .telemetry_schema import (
    AT_FAULT_FIELD,
    DEGRADATION_DEFAULTS,
    LATENCY_FIELDS,
    PUBLISHED_COLUMNS,
    QUARANTINE_COLUMNS,
    RECORD_FIELDS,
    SHADOW_DEFAULTS,
)


class TelemetryFormatError(ValueError):
    """An uploaded telemetry file could not be read as records at all."""


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
    source = {"batch_id": batch_id, "source_commit": source_commit}
    accepted: list[dict[str, Any]] = []
    quarantined: list[dict[str, Any]] = []
    seen: set[str] = set()
    for source_key, data in uploads:
        try:
            records = parse_upload(source_key, data)
        except TelemetryFormatError as error:
            problems = [("unreadable_upload", str(error))]
            quarantined.append(_quarantine_row(source, source_key, -1, None, problems, key))
            continue
        for index, record in enumerate(records):
            problems = check_record(record, settings)
            if not problems and record["record_id"] in seen:
                problems = [("duplicate_record_id", "record_id repeats an earlier record")]
            if problems:
                quarantined.append(
                    _quarantine_row(source, source_key, index, record, problems, key)
                )
                continue
            seen.add(record["record_id"])
            accepted.append({**_published_row(record, key), **source, "source_key": source_key})
    return ValidatedBatch(
        accepted=pd.DataFrame(accepted, columns=list(PUBLISHED_COLUMNS)).astype(
            {name: "float64" for name in LATENCY_FIELDS}
        ),
        quarantined=pd.DataFrame(quarantined, columns=list(QUARANTINE_COLUMNS)),
    )


def _published_row(record: Mapping[str, Any], key: bytes) -> dict[str, Any]:
    """A valid record as published: optional fields defaulted, VIN and raw id pseudonymized,
    the transitions as JSON text."""
    row = {name: record[name] for name in RECORD_FIELDS if name != "vin"}
    row[AT_FAULT_FIELD] = record.get(AT_FAULT_FIELD, record["collisions"])
    row.update({name: record.get(name, default) for name, default in SHADOW_DEFAULTS.items()})
    row.update({name: record.get(name, default) for name, default in DEGRADATION_DEFAULTS.items()})
    row.update(published_outbox(record))
    row["degradation_transitions"] = json.dumps(
        [dict(t) for t in row["degradation_transitions"]], sort_keys=True
    )
    row["record_id"] = hashed_record_id(record["record_id"], key)
    row["vehicle_pseudonym"] = pseudonymize_vin(record["vin"], key)
    row["confidence_histogram"] = [int(c) for c in record["confidence_histogram"]]
    return row


def _quarantine_row(
    source: Mapping[str, str],
    source_key: str,
    index: int,
    record: Any,
    problems: list[tuple[str, str]],
    key: bytes,
) -> dict[str, Any]:
    """One rejected record (or unreadable file, ``index`` -1) with every reason; the VIN only
    as its keyed pseudonym."""
    vin = record.get("vin") if isinstance(record, Mapping) else None
    return {
        **source,
        "source_key": source_key,
        "record_index": index,
        "vehicle_pseudonym": (
            pseudonymize_vin(vin, key) if isinstance(vin, str) and vin.strip() else ""
        ),
        "reason_codes": ",".join(dict.fromkeys(code for code, _ in problems)),
        "reasons": json.dumps([{"code": c, "message": m} for c, m in problems]),
    }


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
