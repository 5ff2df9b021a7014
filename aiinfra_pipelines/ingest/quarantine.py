"""The quarantine table: one record per rejected drive log, published to ``main``.

A rejected log is never deleted (its raw object stays on its ingest branch, at its commit) and
never merged; what reaches ``main`` is only this record of why — without the VIN — so an
operator can find, fix and re-run it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

import pandas as pd

from aiinfra_pipelines.lake.io_manager import parquet_bytes
from aiinfra_pipelines.lake.port import VersionedLake

from .partitions import LogLocation

QUARANTINE_PREFIX = "quarantine/"


def quarantine_key(location: LogLocation) -> str:
    return f"{QUARANTINE_PREFIX}{location.partition_key}.parquet"


def quarantine_record(
    location: LogLocation,
    *,
    source_commit: str,
    checksum: str,
    reasons: Sequence[tuple[str, str]],
    dagster_run_id: str,
) -> pd.DataFrame:
    """A one-row table describing a rejected log and every reason it was rejected."""
    return pd.DataFrame(
        [
            {
                "partition_key": location.partition_key,
                "source_branch": location.branch,
                "log_key": location.key,
                "source_commit": source_commit,
                "checksum": checksum,
                "reason_codes": ",".join(code for code, _ in reasons),
                "reasons": json.dumps([{"code": c, "message": m} for c, m in reasons]),
                "quarantined_at": datetime.now(UTC).isoformat(),
                "dagster_run_id": dagster_run_id,
            }
        ]
    )


def write_quarantine_record(lake: VersionedLake, branch: str, record: pd.DataFrame) -> str:
    """Stage the record on ``branch``; returns its key."""
    location = LogLocation(branch=record.at[0, "source_branch"], key=record.at[0, "log_key"])
    key = quarantine_key(location)
    lake.put_object(branch, key, parquet_bytes(record))
    return key
