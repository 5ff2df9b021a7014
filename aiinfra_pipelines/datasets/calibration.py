"""The quantization calibration sample: small, representative, and covering every condition.

Post-training quantization fixes activation ranges from a calibration sample; a condition that
is missing or rare in it (night, fog) gets clipped ranges and the quantized engine degrades
exactly where it is least tested. So the sample must cover every slice and give every condition
value a minimum share (``calibration.min_share`` in ``resources/gates.yaml``).

Algorithm (``select_calibration_set``), deterministic under ``seed``:

1. Feasibility first: every configured condition value must exist in the source with at least
   ``ceil(share * n)`` frames, and the shares of one dimension must fit in ``n`` — otherwise
   ``CalibrationCoverageError`` names the condition, because silently shipping a calibration set
   without rain frames is worse than failing the run.
2. One frame from every slice, so the sample covers each lighting × weather × road type mix.
3. Greedy quota filling: while some condition value is below its quota, take a frame from the
   slice that reduces the largest relative shortfalls at once (a night-fog-roundabout frame
   counts for three conditions).
4. The rest is drawn uniformly from the remaining frames, so beyond the quotas the sample
   follows the source's natural mix.

Within a slice frames are taken round-robin over its logs (each log's frames shuffled), which
spreads the sample over drives instead of many near-identical frames of one log.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from .grouping import LOG_COLUMN, SLICE_COLUMN, require_columns, seeded_rng

_EPS = 1e-9


class CalibrationCoverageError(ValueError):
    """The source frames cannot give the calibration sample a required condition share."""

    def __init__(self, condition: str, message: str) -> None:
        super().__init__(f"{condition}: {message}")
        self.condition = condition


def _required(share: float, n: int) -> int:
    return math.ceil(float(share) * n - _EPS)


def _check_feasible(
    frames: pd.DataFrame, n: int, min_share: Mapping[str, Mapping[str, float]]
) -> dict[tuple[str, str], int]:
    """Quotas per ``(dimension, value)``; raise naming the first condition that cannot be met."""
    quotas: dict[tuple[str, str], int] = {}
    for dimension, shares in min_share.items():
        if dimension not in frames.columns:
            raise CalibrationCoverageError(dimension, "the frames have no such column")
        available = frames[dimension].astype(str).value_counts()
        total = 0
        for value, share in shares.items():
            need = _required(share, n)
            have = int(available.get(str(value), 0))
            condition = f"{dimension}={value}"
            if have == 0 and need > 0:
                raise CalibrationCoverageError(
                    condition,
                    f"no frames in the source data; the calibration set needs at least "
                    f"{share:.0%} ({need} of {n} frames)",
                )
            if have < need:
                raise CalibrationCoverageError(
                    condition,
                    f"only {have} frames in the source data; the calibration set needs at least "
                    f"{share:.0%} ({need} of {n} frames)",
                )
            quotas[(str(dimension), str(value))] = need
            total += need
        if total > n:
            raise CalibrationCoverageError(
                str(dimension), f"minimum shares add up to {total} frames, more than {n}"
            )
    return quotas


def _slice_queues(frames: pd.DataFrame, seed: int) -> dict[str, list[int]]:
    """Per slice, row positions in pick order: round-robin over shuffled logs and frames."""
    rows_of: dict[str, dict[str, np.ndarray]] = {}
    keys = zip(frames[SLICE_COLUMN].astype(str), frames[LOG_COLUMN].astype(str), strict=True)
    for position, (slice_, log) in enumerate(keys):
        rows_of.setdefault(slice_, {}).setdefault(log, []).append(position)
    queues: dict[str, list[int]] = {}
    for slice_ in sorted(rows_of):
        rng = seeded_rng(seed, f"calibration:{slice_}")
        logs = sorted(rows_of[slice_])
        per_log = []
        for log in (logs[i] for i in rng.permutation(len(logs))):
            rows = np.asarray(rows_of[slice_][log])
            per_log.append(rows[rng.permutation(len(rows))].tolist())
        longest = max(len(rows) for rows in per_log)
        queues[slice_] = [rows[i] for i in range(longest) for rows in per_log if i < len(rows)]
    return queues


def select_calibration_set(
    frames: pd.DataFrame,
    samples: int,
    min_share: Mapping[str, Mapping[str, float]],
    seed: int,
) -> pd.DataFrame:
    """``samples`` frames (all of them if the source is smaller) meeting every minimum share.

    ``min_share`` is ``{dimension column: {value: share}}`` as in gates.yaml
    ``calibration.min_share``. Needs ``log_id``, ``slice`` and the dimension columns. Returns the
    chosen rows (all columns), ordered by source position. Raises ``CalibrationCoverageError``
    (with ``.condition`` like ``"weather=rain"``) when the source cannot satisfy a share.
    """
    require_columns(frames, (LOG_COLUMN, SLICE_COLUMN), "select_calibration_set")
    if frames.empty:
        raise CalibrationCoverageError("frames", "no source frames to calibrate on")
    if int(samples) <= 0:
        raise ValueError(f"samples must be positive, got {samples}")
    frames = frames.reset_index(drop=True)
    n = min(int(samples), len(frames))
    quotas = _check_feasible(frames, n, min_share)
    queues = _slice_queues(frames, seed)
    if len(queues) > n:
        raise CalibrationCoverageError(
            "slices", f"{len(queues)} slices cannot each get a frame in a {n}-frame sample"
        )
    picker = _QuotaPicker(frames, queues, quotas)
    for slice_ in queues:  # step 2: every slice once
        picker.take(slice_)
    # Step 3: quotas. Ties go to a seeded slice order, so no slice is favoured by its name.
    rank = dict(zip(queues, seeded_rng(seed, "calibration").permutation(len(queues)), strict=True))
    while len(picker.taken) < n and (slice_ := picker.most_needed(rank)) is not None:
        picker.take(slice_)
    picker.raise_on_shortfall()

    taken = np.asarray(picker.taken, dtype=int)
    remaining = np.setdiff1d(np.arange(len(frames)), taken)
    rng = seeded_rng(seed, "calibration:fill")
    fill = rng.choice(remaining, size=n - len(taken), replace=False) if n > len(taken) else []
    chosen = np.sort(np.concatenate([taken, np.asarray(fill, dtype=int)]))
    return frames.iloc[chosen].reset_index(drop=True)


class _QuotaPicker:
    """Takes frames from the per-slice queues while counting them against the quotas."""

    def __init__(
        self,
        frames: pd.DataFrame,
        queues: dict[str, list[int]],
        quotas: Mapping[tuple[str, str], int],
    ) -> None:
        self.queues, self.quotas = queues, quotas
        self.values = {dim: frames[dim].astype(str).to_numpy() for dim, _ in quotas}
        self.taken: list[int] = []
        self.counts = dict.fromkeys(quotas, 0)

    def take(self, slice_: str) -> None:
        row = self.queues[slice_].pop(0)
        self.taken.append(row)
        for dimension, value in self.counts:
            if self.values[dimension][row] == value:
                self.counts[(dimension, value)] += 1

    def most_needed(self, rank: Mapping[str, int]) -> str | None:
        """The slice whose next frame closes most of the quotas' relative shortfall (None when
        no queued frame helps any quota)."""
        shortfall = {
            key: (quota - self.counts[key]) / quota
            for key, quota in self.quotas.items()
            if self.counts[key] < quota
        }
        scored = [
            (
                sum(
                    gap
                    for (dim, value), gap in shortfall.items()
                    if self.values[dim][queue[0]] == value
                ),
                -rank[slice_],
                slice_,
            )
            for slice_, queue in self.queues.items()
            if queue
        ]
        scored = [entry for entry in scored if entry[0] > 0]
        return max(scored)[2] if scored else None

    def raise_on_shortfall(self) -> None:
        missing = [key for key in self.quotas if self.counts[key] < self.quotas[key]]
        if missing:
            dimension, value = missing[0]
            raise CalibrationCoverageError(
                f"{dimension}={value}",
                f"reached {self.counts[missing[0]]} of the required {self.quotas[missing[0]]} "
                "frames; the source's condition combinations cannot satisfy every share at once",
            )


def coverage_report(
    sample: pd.DataFrame,
    min_share: Mapping[str, Mapping[str, float]] | None = None,
    dimensions: tuple[str, ...] = ("lighting", "weather", "road_type"),
) -> dict[str, Any]:
    """What the calibration sample covers, JSON-ready, for asset metadata and the gate check.

    ``{"samples", "logs", "slices": {slice: frames}, "shares": {dimension: {value: share}}}``;
    with ``min_share`` also ``"shortfalls"`` (one line per condition below its share) and
    ``"meets_min_share"``.
    """
    n = len(sample)
    dims = list(dict.fromkeys([*dimensions, *(min_share or {})]))
    report: dict[str, Any] = {
        "samples": n,
        "logs": int(sample[LOG_COLUMN].nunique()) if LOG_COLUMN in sample else 0,
        "slices": (
            {str(k): int(v) for k, v in sample[SLICE_COLUMN].value_counts().sort_index().items()}
            if SLICE_COLUMN in sample
            else {}
        ),
        "shares": {
            dim: {
                str(k): round(int(v) / n, 4)
                for k, v in sample[dim].astype(str).value_counts().sort_index().items()
            }
            for dim in dims
            if dim in sample and n
        },
    }
    if min_share is not None:
        shortfalls = []
        for dim, shares in min_share.items():
            for value, share in shares.items():
                count = int((sample[dim].astype(str) == str(value)).sum()) if dim in sample else 0
                if count < _required(share, n):
                    actual = count / n if n else 0.0
                    shortfalls.append(f"{dim}={value}: {actual:.1%} < {float(share):.0%}")
        report["shortfalls"] = shortfalls
        report["meets_min_share"] = not shortfalls
    return report
