"""Drives: the logs one vehicle recorded in one continuous drive, the unit datasets hold out.

A car cuts a drive into segments — the simulated fleet keeps the stretches its triggers fired
on, a real car rotates its recorder every few minutes — and each segment lands as a log. The
consecutive segments of one drive see the same road, weather and traffic seconds apart, so a
split that puts one segment in training and the next in the benchmark scores the model on what
it trained on (the data-health check's split leaks). Logs are grouped into drives from what
every log carries, not from a field some recorder might not write: the vehicle (its pseudonym)
and time — a vehicle's logs belong to one drive while each starts within ``max_gap_s`` of the
end of the one before.
"""

from __future__ import annotations

import hashlib

import pandas as pd

DRIVE_COLUMN = "drive_id"
VEHICLE_COLUMN = "vehicle_pseudonym"
TIME_COLUMN = "timestamp_ns"


def log_drives(index: pd.DataFrame, max_gap_s: float) -> dict[str, str]:
    """``log_id → drive id`` for every log of a scene-index table.

    A log without a vehicle (an index that never recorded one) is a drive of its own: nothing
    says which other logs it belongs with. A drive's id hashes its first log's id — not the
    vehicle's pseudonym, which depends on the anonymization key, so the same logs give the
    same drive ids (and the same seeded splits) on every machine, and ids are stable as later
    logs join the lake.
    """
    if index.empty:
        return {}
    if VEHICLE_COLUMN not in index.columns or TIME_COLUMN not in index.columns:
        return {str(log): _drive_id(str(log)) for log in index["log_id"].unique()}
    spans = (
        index.groupby("log_id", sort=False)
        .agg(
            vehicle=(VEHICLE_COLUMN, "first"),
            start=(TIME_COLUMN, "min"),
            end=(TIME_COLUMN, "max"),
        )
        .reset_index()
    )
    spans["vehicle"] = spans["vehicle"].fillna("").astype(str)
    gap_ns = int(max_gap_s * 1e9)
    drives: dict[str, str] = {}
    for vehicle, logs in spans.sort_values(["vehicle", "start", "log_id"]).groupby("vehicle"):
        current, drive_end = "", None
        for row in logs.itertuples(index=False):
            log_id = str(row.log_id)
            if not vehicle or drive_end is None or int(row.start) - drive_end > gap_ns:
                current, drive_end = _drive_id(log_id), int(row.end)
            else:
                drive_end = max(drive_end, int(row.end))
            drives[log_id] = current
    return drives


def with_drives(index: pd.DataFrame, max_gap_s: float) -> pd.DataFrame:
    """``index`` with a ``drive_id`` column (one value per log)."""
    drives = log_drives(index, max_gap_s)
    return index.assign(**{DRIVE_COLUMN: index["log_id"].astype(str).map(drives)})


def _drive_id(first_log: str) -> str:
    return "drive-" + hashlib.sha256(first_log.encode()).hexdigest()[:16]
