"""One telemetry batch from its landed uploads to ``main``: read, validate, publish.

What ``fleet_telemetry`` does, without Dagster's asset around it. Records and quarantine land in
one publish commit whose metadata rollout uses to find fresh telemetry; a batch with no uploads,
or with nothing valid, fails loudly (``dg.Failure``, no retries: retrying cannot fix the data).
"""

from __future__ import annotations

import dagster as dg

from aiinfra_pipelines.lake.io_manager import parquet_bytes
from aiinfra_pipelines.lake.layout import PUBLISHED_TELEMETRY_PREFIX
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_with_run_branch
from aiinfra_pipelines.release.rollout_telemetry import TELEMETRY_COMMIT_KIND

from .landing import read_uploads
from .telemetry import TelemetrySettings
from .telemetry_intake import ValidatedBatch, validate_uploads

TELEMETRY_QUARANTINE_PREFIX = "telemetry/quarantine/"


def telemetry_records_key(batch: str) -> str:
    return f"{PUBLISHED_TELEMETRY_PREFIX}{batch}.parquet"


def telemetry_quarantine_key(batch: str) -> str:
    return f"{TELEMETRY_QUARANTINE_PREFIX}{batch}.parquet"


def validate_batch(
    lake: VersionedLake, branch: str, commit: str, key: bytes, settings: TelemetrySettings
) -> ValidatedBatch:
    """Every upload at the landed ``commit`` parsed and every record checked; none is a failure."""
    uploads = read_uploads(lake, commit, settings)
    if not uploads:
        raise dg.Failure(
            description=(
                f"no telemetry uploads under {settings.upload_prefix} on {branch} at "
                f"{commit[:12]}: land telemetry first (operations.landing.land_telemetry)"
            ),
            allow_retries=False,
        )
    return validate_uploads(
        uploads, batch_id=branch, source_commit=commit, key=key, settings=settings
    )


def publish_batch(
    lake: VersionedLake,
    root_run_id: str,
    dagster_run_id: str,
    branch: str,
    source_commit: str,
    batch: ValidatedBatch,
) -> str:
    """Records (and quarantine, or its removal) onto ``main`` in one commit; its id."""
    records_key = telemetry_records_key(branch)
    quarantine_key = telemetry_quarantine_key(branch)
    puts = {records_key: parquet_bytes(batch.accepted)}
    if not batch.quarantined.empty:
        puts[quarantine_key] = parquet_bytes(batch.quarantined)
    return publish_with_run_branch(
        lake,
        root_run_id,
        puts,
        f"telemetry {branch}: {len(batch.accepted)} record(s), "
        f"{len(batch.quarantined)} quarantined",
        {
            "kind": TELEMETRY_COMMIT_KIND,
            "batch_id": branch,
            "records_key": records_key,
            "source_commit": source_commit,
            "accepted": str(len(batch.accepted)),
            "quarantined": str(len(batch.quarantined)),
            "dagster_run_id": dagster_run_id,
        },
        deletes=[] if not batch.quarantined.empty else [quarantine_key],
    )


def fail_if_all_quarantined(branch: str, batch: ValidatedBatch, metadata: dict) -> None:
    """A batch where nothing is valid fails after publishing its quarantine, naming reasons."""
    if batch.accepted.empty:
        raise dg.Failure(
            description=(
                f"every telemetry record of {branch} was quarantined "
                f"({len(batch.quarantined)}): {batch.reason_counts}; see "
                f"{telemetry_quarantine_key(branch)} on main"
            ),
            metadata=metadata,
            allow_retries=False,
        )
