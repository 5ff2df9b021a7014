"""The verdict of drive-log validation: ``Reason`` and ``ValidationReport``.

Kept apart from the checks so that code which only reads a verdict (the ingest index, the
quarantine table, the package API) does not pull in every check and its dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.logs.pii_check import PiiFinding


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
    # Frame signal -> where its values came from ("/odom twist.twist.linear.x"), "unknown"
    # where the recording does not carry it (NaN in the frames, DriveLog.unknown_signals).
    signal_sources: dict[str, str] = field(default_factory=dict)
    # Metadata keys the source profile derived (no record stated them) -> how: the content
    # hash, the first message time, the supported version, or "unknown".
    derived_metadata: dict[str, str] = field(default_factory=dict)
    # Every channel of the file as read (topic, encoding, schema, messages, rate_hz); empty when
    # the container itself could not be read. What ``logs inspect`` shows, from the same scan.
    channels: list[dict[str, Any]] = field(default_factory=list)

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
            "signal_sources": dict(self.signal_sources),
            "derived_metadata": dict(self.derived_metadata),
        }
