"""Helpers shared by the split, benchmark and calibration logic.

Drives, not frames or logs, are the unit of every hold-out decision: consecutive frames of one
drive are near-duplicates, and so are the consecutive logs a car cuts one drive into, so a
drive that contributes to both training and evaluation would leak. Tables without a
``drive_id`` column (a drive per log: :mod:`.drives`) fall back to the log as the unit.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

LOG_COLUMN = "log_id"
SLICE_COLUMN = "slice"
DRIVE_COLUMN = "drive_id"


def require_columns(frames: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """Fail early with the missing column names instead of a KeyError deep inside pandas."""
    missing = [column for column in columns if column not in frames.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; got {sorted(frames.columns)}")


def seeded_rng(seed: int, key: str) -> np.random.Generator:
    """A generator that depends only on ``seed`` and ``key``.

    Python's ``hash`` is salted per process, so the key goes through SHA-256: the same seed then
    picks the same logs for a slice on every machine, whatever other slices exist.
    """
    digest = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return np.random.default_rng(np.random.SeedSequence([int(seed), digest]))


def round_half_up(value: float) -> int:
    """Round like a person would (0.5 → 1); Python's ``round`` goes to even (0.5 → 0)."""
    return math.floor(value + 0.5)


def log_slices(frames: pd.DataFrame) -> dict[str, str]:
    """``log_id → slice``; a log's slice is its most frequent one (ties: alphabetically first).

    Slice tags come from log metadata, so a log normally has exactly one; the majority rule only
    keeps the result defined for tables that were relabelled frame by frame.
    """
    require_columns(frames, (LOG_COLUMN, SLICE_COLUMN), "grouping by log")
    if frames.empty:
        return {}
    counts = frames.groupby([LOG_COLUMN, SLICE_COLUMN], sort=True).size().rename("n").reset_index()
    counts = counts.sort_values(
        [LOG_COLUMN, "n", SLICE_COLUMN], ascending=[True, False, True], kind="stable"
    )
    first = counts.drop_duplicates(LOG_COLUMN, keep="first")
    return {
        str(log): str(slice_)
        for log, slice_ in zip(first[LOG_COLUMN], first[SLICE_COLUMN], strict=True)
    }


def logs_by_slice(frames: pd.DataFrame) -> dict[str, list[str]]:
    """``slice → sorted log ids``, so downstream shuffles never depend on input row order."""
    grouped: dict[str, list[str]] = {}
    for log, slice_ in log_slices(frames).items():
        grouped.setdefault(slice_, []).append(log)
    return {slice_: sorted(logs) for slice_, logs in sorted(grouped.items())}


def shuffled(items: list[str], seed: int, key: str) -> list[str]:
    """A seeded permutation of ``items`` (sorted first, so the result ignores input order)."""
    ordered = sorted(items)
    order = seeded_rng(seed, key).permutation(len(ordered))
    return [ordered[i] for i in order]


def unit_column(frames: pd.DataFrame) -> str:
    """What a hold-out decision moves as a whole: the drive where known, else the log."""
    return DRIVE_COLUMN if DRIVE_COLUMN in frames.columns else LOG_COLUMN


def units_by_slice(frames: pd.DataFrame) -> dict[str, list[str]]:
    """``slice → sorted units`` (drives, or logs without drive ids); a unit's slice is the most
    frequent slice of its frames (ties: alphabetically first)."""
    unit = unit_column(frames)
    if unit == LOG_COLUMN:
        return logs_by_slice(frames)
    per_log = log_slices(frames)
    counts = (
        frames.assign(**{SLICE_COLUMN: frames[LOG_COLUMN].astype(str).map(per_log)})
        .groupby([unit, SLICE_COLUMN], sort=True)
        .size()
        .rename("n")
        .reset_index()
        .sort_values([unit, "n", SLICE_COLUMN], ascending=[True, False, True], kind="stable")
        .drop_duplicates(unit, keep="first")
    )
    grouped: dict[str, list[str]] = {}
    for value, slice_ in zip(counts[unit], counts[SLICE_COLUMN], strict=True):
        grouped.setdefault(str(slice_), []).append(str(value))
    return {slice_: sorted(units) for slice_, units in sorted(grouped.items())}


def unit_logs(frames: pd.DataFrame) -> dict[str, list[str]]:
    """``unit → sorted log ids`` (a log is its own unit without drive ids)."""
    unit = unit_column(frames)
    if unit == LOG_COLUMN:
        return {str(log): [str(log)] for log in frames[LOG_COLUMN].unique()}
    pairs = frames[[unit, LOG_COLUMN]].astype(str).drop_duplicates()
    grouped: dict[str, list[str]] = {}
    for value, log in zip(pairs[unit], pairs[LOG_COLUMN], strict=True):
        grouped.setdefault(value, []).append(log)
    return {value: sorted(logs) for value, logs in grouped.items()}
