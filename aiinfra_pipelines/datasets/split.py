"""Train/val split by log, stratified by scenario slice.

Algorithm (``split_by_log``):

1. Every log is assigned to one slice (its frames' slice tag; see ``grouping.log_slices``).
   Logs are atomic: all frames of a log land in the same split, because neighbouring frames of
   one drive are near-duplicates and would make validation scores meaningless.
2. For each slice with ``n >= 2`` logs, the sorted log ids are permuted with a generator seeded
   by ``(seed, slice name)`` and the first ``k = clamp(round_half_up(val_fraction * n), 1,
   n - 1)`` go to ``val``, the rest to ``train``. The clamp guarantees that every multi-log
   slice is both trained on and validated; seeding per slice means adding a new slice does not
   reshuffle the others.
3. Logs of single-log slices cannot be in both splits, so they are pooled, permuted with
   ``(seed, "single-log slices")`` and ``round_half_up(val_fraction * pool)`` of them go to
   ``val``. The overall val share stays close to ``val_fraction`` and rare slices still show up
   in validation from time to time instead of never.

The result is a pure function of the set of ``(log_id, slice)`` pairs and the seed.
"""

from __future__ import annotations

import pandas as pd

from .grouping import LOG_COLUMN, logs_by_slice, require_columns, round_half_up, shuffled

SPLIT_COLUMN = "split"
TRAIN = "train"
VAL = "val"
SPLITS: tuple[str, ...] = (TRAIN, VAL)
_SINGLETON_KEY = "single-log slices"


class SplitLeakageError(ValueError):
    """A log appears in more than one split: validation would score frames seen in training."""


def assign_logs(frames: pd.DataFrame, val_fraction: float, seed: int) -> dict[str, str]:
    """``log_id → "train" | "val"`` following the algorithm in the module docstring."""
    if not 0.0 < float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction must be strictly between 0 and 1, got {val_fraction}")
    assignment: dict[str, str] = {}
    singletons: list[str] = []
    for slice_, logs in logs_by_slice(frames).items():
        if len(logs) < 2:
            singletons.extend(logs)
            continue
        k = min(max(round_half_up(val_fraction * len(logs)), 1), len(logs) - 1)
        for position, log in enumerate(shuffled(logs, seed, slice_)):
            assignment[log] = VAL if position < k else TRAIN
    k = round_half_up(val_fraction * len(singletons))
    for position, log in enumerate(shuffled(singletons, seed, _SINGLETON_KEY)):
        assignment[log] = VAL if position < k else TRAIN
    return assignment


def split_by_log(frames: pd.DataFrame, val_fraction: float, seed: int) -> pd.DataFrame:
    """A copy of ``frames`` with a ``split`` column (``train``/``val``); no log in both.

    Needs ``log_id`` and ``slice`` columns. Deterministic under ``seed`` and independent of row
    order. See the module docstring for the stratification rule.
    """
    require_columns(frames, (LOG_COLUMN, "slice"), "split_by_log")
    assignment = assign_logs(frames, val_fraction, seed)
    result = frames.assign(**{SPLIT_COLUMN: frames[LOG_COLUMN].astype(str).map(assignment)})
    assert_disjoint_logs(result)
    return result


def assert_disjoint_logs(df: pd.DataFrame, split_column: str = SPLIT_COLUMN) -> None:
    """Raise ``SplitLeakageError`` naming every log that sits in more than one split.

    The check that guards the dataset's main promise; the training asset calls it on every
    dataset it writes, and tests call it on every split they produce.
    """
    require_columns(df, (LOG_COLUMN, split_column), "assert_disjoint_logs")
    if df[split_column].isna().any():
        unassigned = sorted(df.loc[df[split_column].isna(), LOG_COLUMN].astype(str).unique())
        raise SplitLeakageError(f"frames without a split for logs {unassigned[:10]}")
    per_log = df.groupby(LOG_COLUMN)[split_column].unique()
    shared = {
        str(log): sorted(map(str, splits)) for log, splits in per_log.items() if len(splits) > 1
    }
    if shared:
        listed = ", ".join(f"{log} in {splits}" for log, splits in sorted(shared.items())[:10])
        more = f" (and {len(shared) - 10} more)" if len(shared) > 10 else ""
        raise SplitLeakageError(f"{len(shared)} log(s) appear in several splits: {listed}{more}")
