"""Metadata checks: the ``drive_log`` record's key set, values and identity format.

``unknown`` is a valid VIN only where the source profile derived it (a recorder that never
knew the car, logs.sources.metadata), never where a record states it: a record saying
``vin=unknown`` is a broken record. Its pseudonym (logs.anonymize) is ``unknown`` too.

Apart from the content checks because metadata is all an index-only upload carries: the
ingest index checks it without any frames (``ingest.index_records``).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.anonymize import PSEUDONYM_KEY, PSEUDONYM_PREFIX
from aiinfra_pipelines.logs.model import (
    METADATA_SCHEMA_VERSION,
    OPTIONAL_METADATA_KEYS,
    REQUIRED_METADATA_KEYS,
    UNKNOWN_VALUE,
)
from aiinfra_pipelines.logs.reader import ScannedLog
from aiinfra_pipelines.logs.validation_report import Reason


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
    if value in (None, UNKNOWN_VALUE) or re.fullmatch(rf"{PSEUDONYM_PREFIX}[0-9a-f]+", value):
        return []
    return [Reason("invalid_pseudonym", f"{PSEUDONYM_KEY} {value!r} is not a pseudonym")]


def _check_vin(
    metadata: dict[str, str], rules: dict[str, Any], derived_unknown: frozenset[str]
) -> list[Reason]:
    value = metadata.get("vin")
    if value is None or re.fullmatch(rules["vin_pattern"], value):
        return []
    if value == UNKNOWN_VALUE and "vin" in derived_unknown:
        return []
    return [Reason("invalid_vin", f"vin of length {len(value)} does not match the VIN pattern")]


def check_metadata(
    metadata: dict[str, str],
    rules: dict[str, Any],
    anonymized: bool = False,
    derived_unknown: frozenset[str] = frozenset(),
) -> list[Reason]:
    """Key set, schema version, categorical values, recorded_at and VIN (or pseudonym) format.

    ``derived_unknown``: keys the source profile recorded as ``unknown`` (no recorder writes
    them); there, and only there, ``unknown`` passes a format check.
    """
    return [
        *_check_keys(metadata, anonymized),
        *_check_categories(metadata, rules),
        *_check_recorded_at(metadata, rules),
        *(
            _check_pseudonym(metadata)
            if anonymized
            else _check_vin(metadata, rules, derived_unknown)
        ),
    ]


def metadata_reasons(
    scanned: ScannedLog, rules: dict[str, Any], anonymized: bool
) -> tuple[dict, list[Reason]]:
    """The first ``drive_log`` record and every reason against it (none, or several)."""
    records = scanned.drive_log_metadata()
    if not records:
        return {}, [Reason(errors.MISSING_METADATA, "no 'drive_log' metadata record")]
    reasons = []
    if len(records) > 1:
        reasons.append(
            Reason("duplicate_metadata", f"{len(records)} 'drive_log' records; the first is used")
        )
    return records[0], reasons + check_metadata(records[0], rules, anonymized)
