"""``aiinfra logs inspect``: what an engineer checks on a recording before uploading it.

The same validation ingestion runs (``validate_drive_log``, profile matching included), plus
what helps fix a refused file: every channel with its encoding, schema, message count and rate,
and the sensors the profile found with their calibration. One JSON object with ``--json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiinfra_pipelines.logs.pii_check import pii_findings_report
from aiinfra_pipelines.logs.sources.profiles import load_profiles
from aiinfra_pipelines.logs.validation import validate_drive_log


def inspect_log(path: Path, source: str | None = None) -> dict[str, Any]:
    """The inspection report of one MCAP file (never raises for a bad file; a ``source`` that
    names no profile is a ``ValueError``: the question itself is wrong)."""
    if source is not None and source not in load_profiles():
        known = ", ".join(sorted(load_profiles()))
        raise ValueError(f"no source profile named {source!r} (resources/sources: {known})")
    # Scanned once, here, and streamed: a long recording is checked in bounded memory, its
    # images decoded frame by frame from the file.
    report = validate_drive_log(path, source=source, streaming=True)
    return {
        "file": str(path),
        "bytes": path.stat().st_size,
        "accepted": report.accepted,
        "profile": report.profile,
        "frames": int(report.frame_count),
        "duration_s": report.duration_s,
        "frame_rate_hz": report.frame_rate_hz,
        "reasons": [{"code": r.code, "message": r.message} for r in report.reasons],
        "metadata": dict(report.metadata),
        "channels": list(report.channels),
        "sensors": list(report.sensors),
        "derived_conditions": dict(report.derived_conditions),
        # Where each frame signal came from, "unknown" where the recording lacks it; and the
        # metadata the profile derived because no record stated it.
        "signal_sources": dict(report.signal_sources),
        "derived_metadata": dict(report.derived_metadata),
        # The cloud's PII check as ingest runs it: check a file before and after upload.
        "pii_findings": pii_findings_report(report.pii_findings),
    }
