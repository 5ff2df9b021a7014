"""A real recording's metadata: what its record states, and what the profile derives.

The project keys every log by metadata (``logs.model.REQUIRED_METADATA_KEYS``) that no stock
recorder writes: ``ros2 bag record`` stores a ``rosbag2`` record (its own bag description),
never a ``drive_log``. A source profile's ``metadata.derived`` map says, per project key, where
the value comes from when the file's record (``metadata.record``) does not state it:

- ``content_sha256``: the file's SHA-256 (``prefix`` + the first ``hex_chars``), a stable id;
- ``first_message_time``: the earliest message's log time, ISO-8601 in UTC;
- ``supported_version``: the metadata schema version this code reads;
- ``unknown``: what a recorder cannot know (the VIN, the software running) — recorded as
  ``unknown``, a value of its own that validation accepts for derived keys only, never a guess.

What a record states always wins; every derived key is reported with how it was derived.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiinfra_pipelines.logs.model import METADATA_SCHEMA_VERSION, UNKNOWN_VALUE

CONTENT_SHA256 = "content_sha256"
FIRST_MESSAGE_TIME = "first_message_time"
SUPPORTED_VERSION = "supported_version"
UNKNOWN = UNKNOWN_VALUE
DERIVATIONS = frozenset({CONTENT_SHA256, FIRST_MESSAGE_TIME, SUPPORTED_VERSION, UNKNOWN})
_SHA256_HEX = 64


@dataclass(frozen=True)
class MetadataRule:
    """How one project key is derived when the record lacks it."""

    key: str
    source: str
    prefix: str = ""
    hex_chars: int = _SHA256_HEX


def parse_metadata_rules(raw: Mapping[str, Any] | None, profile: str) -> dict[str, MetadataRule]:
    """``metadata.derived``: ``key: <derivation>`` or ``key: {from: <derivation>, ...}``."""
    rules = {}
    for key, entry in (raw or {}).items():
        spec = entry if isinstance(entry, Mapping) else {"from": entry}
        rule = MetadataRule(
            key=str(key),
            source=str(spec.get("from", "")),
            prefix=str(spec.get("prefix", "")),
            hex_chars=int(spec.get("hex_chars", _SHA256_HEX)),
        )
        if rule.source not in DERIVATIONS:
            raise ValueError(
                f"source profile {profile}: metadata {key} from {rule.source!r} is not one of "
                f"{sorted(DERIVATIONS)}"
            )
        if not 0 < rule.hex_chars <= _SHA256_HEX:
            raise ValueError(f"source profile {profile}: metadata {key} hex_chars out of range")
        rules[rule.key] = rule
    return rules


@dataclass
class RecordingMetadata:
    """The metadata a log is validated with, and what was derived rather than recorded."""

    values: dict[str, str] = field(default_factory=dict)
    # key -> how it was derived (shown in reports next to the derived conditions)
    derived: dict[str, str] = field(default_factory=dict)
    # How many of the profile's records the file has (0: everything above is derived).
    records: int = 0

    @property
    def unknown(self) -> frozenset[str]:
        """Keys the profile recorded as ``unknown``: the only ones where that value is valid."""
        return frozenset(key for key, how in self.derived.items() if how == UNKNOWN)


def _first_message_time(times_ns: Iterable[int]) -> str:
    first = min(times_ns, default=None)
    if first is None:
        return UNKNOWN
    return datetime.fromtimestamp(first / 1e9, tz=UTC).isoformat()


def derive_metadata(profile: Any, scanned: Any) -> RecordingMetadata:
    """The first record of the profile's name (keys renamed), completed by its derived map."""
    records = profile.metadata_records(scanned.metadata)
    result = RecordingMetadata(values=dict(records[0]) if records else {}, records=len(records))
    for key, rule in profile.metadata_derived.items():
        if key in result.values:
            continue
        if rule.source == CONTENT_SHA256:
            value = rule.prefix + scanned.sha256[: rule.hex_chars]
        elif rule.source == FIRST_MESSAGE_TIME:
            times = (r.log_time for records in scanned.messages.values() for r in records)
            value = _first_message_time(times)
        elif rule.source == SUPPORTED_VERSION:
            value = METADATA_SCHEMA_VERSION
        else:
            value = UNKNOWN
        result.values[key] = value
        result.derived[key] = UNKNOWN if value == UNKNOWN else rule.source
    return result
