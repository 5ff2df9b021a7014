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

from .partitions import LogLocation

QUARANTINE_PREFIX = "quarantine/"


def quarantine_key(location: LogLocation) -> str:
    return f"{QUARANTINE_PREFIX}{location.name}.parquet"


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
                "log": location.name,
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
