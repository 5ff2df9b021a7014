"""Train/val split by drive, stratified by scenario slice.

Algorithm (``split_by_log``; "unit" is the drive — the consecutive logs one car recorded in one
drive, ``drives.log_drives`` — or the log where a table has no drive ids):

1. Every unit is assigned to one slice (its frames' most frequent slice tag; see
   ``grouping.units_by_slice``). Units are atomic: all frames of a drive land in the same
   split, because neighbouring frames — and the next segment of the same drive — are
   near-duplicates and would make validation scores meaningless.
2. For each slice with ``n >= 2`` units, the sorted unit ids are permuted with a generator seeded
   by ``(seed, slice name)`` and the first ``k = clamp(round_half_up(val_fraction * n), 1,
   n - 1)`` go to ``val``, the rest to ``train``. The clamp guarantees that every multi-log
   slice is both trained on and validated; seeding per slice means adding a new slice does not
   reshuffle the others.
3. Units of single-unit slices cannot be in both splits, so they are pooled, permuted with
   ``(seed, "single-log slices")`` and ``round_half_up(val_fraction * pool)`` of them go to
   ``val``. The overall val share stays close to ``val_fraction`` and rare slices still show up
   in validation from time to time instead of never.

The result is a pure function of the set of ``(unit, log_id, slice)`` rows and the seed.
"""

from __future__ import annotations

import pandas as pd

from .grouping import (
    DRIVE_COLUMN,
    LOG_COLUMN,
    require_columns,
    round_half_up,
    shuffled,
    unit_logs,
    units_by_slice,
)

SPLIT_COLUMN = "split"
TRAIN = "train"
VAL = "val"
SPLITS: tuple[str, ...] = (TRAIN, VAL)
_SINGLETON_KEY = "single-log slices"


class SplitLeakageError(ValueError):
    """A log appears in more than one split: validation would score frames seen in training."""


def assign_logs(frames: pd.DataFrame, val_fraction: float, seed: int) -> dict[str, str]:
    """``log_id → "train" | "val"`` following the algorithm in the module docstring: every log
    of a unit (drive) gets its unit's split."""
    if not 0.0 < float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction must be strictly between 0 and 1, got {val_fraction}")
    assignment: dict[str, str] = {}
    singletons: list[str] = []
    for slice_, units in units_by_slice(frames).items():
        if len(units) < 2:
            singletons.extend(units)
            continue
        k = min(max(round_half_up(val_fraction * len(units)), 1), len(units) - 1)
        for position, unit in enumerate(shuffled(units, seed, slice_)):
            assignment[unit] = VAL if position < k else TRAIN
    k = round_half_up(val_fraction * len(singletons))
    for position, unit in enumerate(shuffled(singletons, seed, _SINGLETON_KEY)):
        assignment[unit] = VAL if position < k else TRAIN
    return {log: assignment[unit] for unit, logs in unit_logs(frames).items() for log in logs}


def split_by_log(frames: pd.DataFrame, val_fraction: float, seed: int) -> pd.DataFrame:
    """A copy of ``frames`` with a ``split`` column (``train``/``val``); no log, and no drive
    (with a ``drive_id`` column), in both.

    Needs ``log_id`` and ``slice`` columns. Deterministic under ``seed`` and independent of row
    order. See the module docstring for the stratification rule.
    """
    require_columns(frames, (LOG_COLUMN, "slice"), "split_by_log")
    assignment = assign_logs(frames, val_fraction, seed)
    result = frames.assign(**{SPLIT_COLUMN: frames[LOG_COLUMN].astype(str).map(assignment)})
    assert_disjoint_logs(result)
    if DRIVE_COLUMN in result.columns:
        assert_disjoint_logs(result, group_column=DRIVE_COLUMN)
    return result


def assert_disjoint_logs(
    df: pd.DataFrame, split_column: str = SPLIT_COLUMN, group_column: str = LOG_COLUMN
) -> None:
    """Raise ``SplitLeakageError`` naming every log (or drive, ``group_column``) that sits in
    more than one split.

    The check that guards the dataset's main promise; the training asset calls it on every
    dataset it writes, and tests call it on every split they produce.
    """
    require_columns(df, (group_column, split_column), "assert_disjoint_logs")
    if df[split_column].isna().any():
        unassigned = sorted(df.loc[df[split_column].isna(), group_column].astype(str).unique())
        raise SplitLeakageError(f"frames without a split for {group_column} {unassigned[:10]}")
    per_log = df.groupby(group_column)[split_column].unique()
    shared = {
        str(log): sorted(map(str, splits)) for log, splits in per_log.items() if len(splits) > 1
    }
    if shared:
        listed = ", ".join(f"{log} in {splits}" for log, splits in sorted(shared.items())[:10])
        more = f" (and {len(shared) - 10} more)" if len(shared) > 10 else ""
        what = "log(s)" if group_column == LOG_COLUMN else "drive(s)"
        raise SplitLeakageError(f"{len(shared)} {what} appear in several splits: {listed}{more}")
