"""Telemetry uploads on ingest branches: landing a batch, and finding what landed.

The uploader's side mirrors ``fleet.landing.land_batch`` for drive logs: files under
``telemetry/uploads/<batch>/`` on ``ingest-<batch>``, one commit with batch metadata. Raw
telemetry carries VINs, so like raw logs it stays on the ingest branch; ``main`` only receives
the validated, pseudonymized table ``fleet_telemetry`` publishes.

Discovery is the sensor's half: per ingest branch whose head moved, did the move touch the
upload prefix? One partition per branch (the batch), re-published whenever more telemetry
lands on it; the run key names the branch head, so a repeated tick, a lost cursor or a
restarted daemon never launches the same publication twice.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from aiinfra_pipelines.fleet.landing import ingest_branch_name
from aiinfra_pipelines.ingest.discovery import moved_ingest_branches
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import commit_changes

from .telemetry import TelemetrySettings


@dataclass(frozen=True)
class LandedTelemetry:
    branch: str
    commit: str
    keys: list[str]
    records: int


def upload_key(batch_id: str, file_name: str, settings: TelemetrySettings | None = None) -> str:
    settings = settings or TelemetrySettings.load()
    return f"{settings.upload_prefix}{batch_id}/{file_name}"


def encode_records(records: Sequence[Mapping[str, Any]], fmt: Literal["json", "parquet"]) -> bytes:
    if fmt == "json":
        return json.dumps(list(records), sort_keys=True, indent=1).encode()
    if fmt == "parquet":
        buffer = io.BytesIO()
        pd.DataFrame(list(records)).to_parquet(buffer, index=False)
        return buffer.getvalue()
    raise ValueError(f"unknown telemetry format {fmt!r} (json or parquet)")


def land_telemetry(
    lake: VersionedLake,
    batch_id: str,
    records: Sequence[Mapping[str, Any]],
    *,
    file_name: str | None = None,
    fmt: Literal["json", "parquet"] = "json",
    raw_files: Mapping[str, bytes] | None = None,
    metadata: dict[str, str] | None = None,
) -> LandedTelemetry:
    """Upload telemetry ``records`` (and any ``raw_files``: name → bytes, as a vehicle sent
    them) to ``ingest-<batch_id>`` under the upload prefix, in one commit."""
    if not records and not raw_files:
        raise ValueError(f"telemetry batch {batch_id!r} has nothing to land")
    settings = TelemetrySettings.load()
    lake.ensure_repository()
    branch = ingest_branch_name(batch_id)
    lake.create_branch(branch, source_ref=MAIN_BRANCH, exist_ok=True)
    files = dict(raw_files or {})
    if records:
        files[file_name or f"records.{fmt}"] = encode_records(records, fmt)
    puts = {upload_key(batch_id, name, settings): data for name, data in files.items()}
    keys = list(puts)
    commit = commit_changes(
        lake,
        branch,
        f"telemetry batch {batch_id}: {len(records)} record(s) in {len(keys)} file(s)",
        {
            "kind": "telemetry-upload",
            "batch_id": batch_id,
            "record_count": str(len(records)),
            **(metadata or {}),
        },
        puts=puts,
        allow_empty=False,
    )
    return LandedTelemetry(branch=branch, commit=commit, keys=sorted(keys), records=len(records))


def read_uploads(
    lake: VersionedLake, ref: str, settings: TelemetrySettings | None = None
) -> list[tuple[str, bytes]]:
    """Every telemetry upload file at ``ref`` (an ingest branch or its commit), by key."""
    settings = settings or TelemetrySettings.load()
    return [
        (stat.key, lake.get_object(ref, stat.key))
        for stat in lake.list_objects(ref, prefix=settings.upload_prefix)
    ]


@dataclass(frozen=True)
class TelemetryBatch:
    """An ingest branch whose telemetry uploads changed, at the head that changed them."""

    branch: str
    commit: str

    @property
    def partition_key(self) -> str:
        return self.branch

    @property
    def run_key(self) -> str:
        return f"telemetry-{self.branch}@{self.commit}"


def discover_telemetry(
    lake: VersionedLake, cursor: Mapping[str, str], settings: TelemetrySettings | None = None
) -> tuple[list[TelemetryBatch], dict[str, str]]:
    """Batches with new or changed telemetry uploads since ``cursor`` (branch → head seen)."""
    settings = settings or TelemetrySettings.load()
    moved, next_cursor = moved_ingest_branches(lake, cursor, settings.upload_prefix)
    batches = [
        TelemetryBatch(branch=branch.name, commit=branch.head)
        for branch in moved
        if any(change.type != "removed" for change in branch.changes)
    ]
    return batches, next_cursor
