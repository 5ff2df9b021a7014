"""Helpers shared by the split, benchmark and calibration logic.

Logs, not frames, are the unit of every dataset decision: consecutive frames of one drive are
near-duplicates, so a log that contributes to both training and evaluation would leak.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

LOG_COLUMN = "log_id"
SLICE_COLUMN = "slice"


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
