"""The benchmark set: held-out drives' logs per slice, frozen across dataset versions.

A benchmark is only useful if it stays put: metrics of two models are comparable only on the
same frames, and a benchmark that drifts with every new batch would let a regression hide behind
a membership change. So the manifest is the source of truth, and ``freeze_benchmark``

* keeps every existing benchmark log, whatever new data arrives;
* adds logs automatically only for slices the benchmark does not cover yet (recorded as an
  ``extended`` change); logs removed explicitly are ``retired_logs`` and never re-picked
  automatically;
* changes membership otherwise (add logs to a covered slice, remove logs) only when the caller
  passes an explicit ``reason``, which is recorded, with what changed, in ``changes``.

Every membership change bumps ``version`` (``benchmark-v0001``, ``benchmark-v0002`` …).
Benchmark logs never enter training: ``exclude_benchmark`` drops them from any frame table.

Per slice with ``n`` drives the selection holds out ``max(min_logs_per_slice,
round_half_up(fraction * n))`` whole drives (every log of each), capped at ``n - 1`` so the
slice is still trained on. A slice driven once therefore stays uncovered (listed in
``uncovered_slices``) until another drive of it arrives; then the next ``freeze_benchmark``
covers it. Tables without drive ids (``drives.log_drives``) count logs instead.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .grouping import (
    DRIVE_COLUMN,
    LOG_COLUMN,
    log_slices,
    require_columns,
    round_half_up,
    shuffled,
    unit_logs,
    units_by_slice,
)

BENCHMARK_VERSION_PREFIX = "benchmark-v"
CHANGE_CREATED = "created"
CHANGE_EXTENDED = "extended"
CHANGE_EXPLICIT = "explicit"


class BenchmarkChangeError(ValueError):
    """A benchmark membership change was requested without a reason, or is inconsistent."""


def select_benchmark_logs(
    frames: pd.DataFrame,
    fraction: float,
    seed: int,
    min_logs_per_slice: int,
    *,
    exclude_logs: Iterable[str] = (),
) -> dict[str, list[str]]:
    """``slice → sorted held-out log ids`` chosen from ``frames`` (see module docstring).

    Whole drives are held out (with a ``drive_id`` column; else single logs): every log of a
    chosen drive joins the benchmark, and the counts (``fraction``, ``min_logs_per_slice``)
    are of drives. ``exclude_logs`` are logs that may not be held out (typically logs some
    model already trained on: putting them in the benchmark would score that model on its own
    training data); a drive with any such log is not held out. They still count towards the
    slice's total. Slices that get no log are omitted.
    """
    if not 0.0 <= float(fraction) < 1.0:
        raise ValueError(f"benchmark fraction must be in [0, 1), got {fraction}")
    if int(min_logs_per_slice) < 0:
        raise ValueError(f"min_logs_per_slice must be >= 0, got {min_logs_per_slice}")
    excluded = {str(log) for log in exclude_logs}
    logs_of = unit_logs(frames) if len(frames) else {}
    selected: dict[str, list[str]] = {}
    for slice_, units in units_by_slice(frames).items():
        wanted = max(int(min_logs_per_slice), round_half_up(fraction * len(units)))
        candidates = [u for u in units if not excluded.intersection(logs_of[u])]
        k = min(wanted, len(units) - 1, len(candidates))
        if k > 0:
            chosen = shuffled(candidates, seed, f"benchmark:{slice_}")[:k]
            selected[slice_] = sorted(log for unit in chosen for log in logs_of[unit])
    return selected


def benchmark_log_ids(manifest: Mapping[str, Any]) -> set[str]:
    """Every log of the benchmark, over all slices."""
    return {str(log) for logs in manifest.get("slices", {}).values() for log in logs}


def exclude_benchmark(frames: pd.DataFrame, benchmark_manifest: Mapping[str, Any]) -> pd.DataFrame:
    """``frames`` without any benchmark log — nor, with a ``drive_id`` column, any log of a
    drive the benchmark holds a log of (a segment landing later, or a benchmark made before
    drives were the unit): what training and validation may use."""
    require_columns(frames, (LOG_COLUMN,), "exclude_benchmark")
    held_out = frames[LOG_COLUMN].astype(str).isin(benchmark_log_ids(benchmark_manifest))
    if DRIVE_COLUMN in frames.columns:
        held_out |= frames[DRIVE_COLUMN].isin(set(frames.loc[held_out, DRIVE_COLUMN]))
    return frames.loc[~held_out].reset_index(drop=True)


def benchmark_frames(frames: pd.DataFrame, benchmark_manifest: Mapping[str, Any]) -> pd.DataFrame:
    """Only the frames of benchmark logs: what offline evaluation scores every model on."""
    require_columns(frames, (LOG_COLUMN,), "benchmark_frames")
    held_out = benchmark_log_ids(benchmark_manifest)
    return frames.loc[frames[LOG_COLUMN].astype(str).isin(held_out)].reset_index(drop=True)


def _version(number: int) -> str:
    return f"{BENCHMARK_VERSION_PREFIX}{number:04d}"


def _version_number(version: str) -> int:
    if not version.startswith(BENCHMARK_VERSION_PREFIX):
        raise ValueError(f"not a benchmark version: {version!r}")
    return int(version[len(BENCHMARK_VERSION_PREFIX) :])


def _selection_params(
    existing: Mapping[str, Any] | None,
    fraction: float | None,
    seed: int | None,
    min_logs_per_slice: int | None,
) -> dict[str, Any]:
    """Explicit arguments win; otherwise reuse what the manifest recorded at creation."""
    recorded = dict(existing.get("selection", {})) if existing else {}
    params = {
        "fraction": fraction if fraction is not None else recorded.get("fraction"),
        "seed": seed if seed is not None else recorded.get("seed"),
        "min_logs_per_slice": (
            min_logs_per_slice
            if min_logs_per_slice is not None
            else recorded.get("min_logs_per_slice")
        ),
    }
    missing = [name for name, value in params.items() if value is None]
    if missing:
        raise ValueError(f"benchmark selection needs {missing} (not given, not in the manifest)")
    return {
        "fraction": float(params["fraction"]),
        "seed": int(params["seed"]),
        "min_logs_per_slice": int(params["min_logs_per_slice"]),
    }


def freeze_benchmark(
    existing_manifest: Mapping[str, Any] | None,
    new_frames: pd.DataFrame,
    *,
    fraction: float | None = None,
    seed: int | None = None,
    min_logs_per_slice: int | None = None,
    exclude_logs: Iterable[str] = (),
    add_logs: Iterable[str] = (),
    remove_logs: Iterable[str] = (),
    reason: str | None = None,
) -> dict[str, Any]:
    """The benchmark manifest after seeing ``new_frames``; never mutates ``existing_manifest``.

    ``existing_manifest=None`` creates the benchmark (version ``benchmark-v0001``). Otherwise the
    existing logs are kept and only slices not covered yet get logs, chosen with the selection
    parameters (arguments, else those recorded in the manifest). ``add_logs``/``remove_logs``
    change membership explicitly and require ``reason``; added logs must be in ``new_frames``
    (for their slice) and not in ``exclude_logs``. The manifest is a JSON-ready dict::

        {"name": "benchmark_set", "version": "benchmark-v0002",
         "selection": {"fraction": 0.2, "seed": 0, "min_logs_per_slice": 1},
         "slices": {"night/rain/highway": ["log-a", ...], ...},
         "logs": 7, "uncovered_slices": [...], "retired_logs": [...],
         "changes": [{"version": ..., "kind": "created"|"extended"|"explicit",
                      "reason": ..., "added": {slice: [logs]}, "removed": {slice: [logs]}}]}
    """
    params = _selection_params(existing_manifest, fraction, seed, min_logs_per_slice)
    add, remove = _membership_change(add_logs, remove_logs, reason)
    excluded = {str(log) for log in exclude_logs}
    seen = units_by_slice(new_frames)
    history = _History.of(existing_manifest)
    slices, retired = history.slices, history.retired
    pending: list[dict[str, Any]] = []

    # Automatic part: first logs for slices without any (every slice, on creation). Logs already
    # held out or retired by an explicit removal are never picked again automatically.
    uncovered = [slice_ for slice_ in seen if not slices.get(slice_)]
    chosen = select_benchmark_logs(
        new_frames.loc[new_frames["slice"].astype(str).isin(uncovered)],
        params["fraction"],
        params["seed"],
        params["min_logs_per_slice"],
        exclude_logs=excluded | retired | benchmark_log_ids({"slices": slices}),
    )
    slices.update(chosen)
    if existing_manifest is None:
        why = reason or "initial selection"
        pending.append({"kind": CHANGE_CREATED, "reason": why, "added": chosen, "removed": {}})
    elif chosen:
        why = f"first benchmark logs for slices {sorted(chosen)}"
        pending.append({"kind": CHANGE_EXTENDED, "reason": why, "added": chosen, "removed": {}})

    # Explicit part: only with a reason (checked above).
    if add or remove:
        pending.append(_explicit_change(slices, new_frames, add, remove, excluded, str(reason)))
        retired = (retired | set(remove)) - set(add)

    number, changes = history.number, history.changes
    for change in pending:
        number += 1
        changes.append({"version": _version(number), **change})
    slices = {slice_: logs for slice_, logs in sorted(slices.items()) if logs}
    return {
        "name": "benchmark_set",
        "version": _version(number),
        "selection": params,
        "slices": slices,
        "logs": sum(len(logs) for logs in slices.values()),
        "uncovered_slices": sorted((set(seen) | history.uncovered) - set(slices)),
        "retired_logs": sorted(retired),
        "changes": changes,
    }


def _membership_change(
    add_logs: Iterable[str], remove_logs: Iterable[str], reason: str | None
) -> tuple[list[str], list[str]]:
    """The logs to add and remove, refused without a reason: membership changes are explicit."""
    add = sorted({str(log) for log in add_logs})
    remove = sorted({str(log) for log in remove_logs})
    if (add or remove) and not (reason and reason.strip()):
        raise BenchmarkChangeError(
            "changing benchmark membership is an explicit act: pass a non-empty reason "
            f"(add={add}, remove={remove})"
        )
    return add, remove


@dataclass
class _History:
    """What a new version inherits from the manifest before it (nothing, on creation)."""

    slices: dict[str, list[str]] = field(default_factory=dict)
    changes: list[dict[str, Any]] = field(default_factory=list)
    retired: set[str] = field(default_factory=set)
    uncovered: set[str] = field(default_factory=set)
    number: int = 0

    @classmethod
    def of(cls, manifest: Mapping[str, Any] | None) -> _History:
        if manifest is None:
            return cls()
        return cls(
            slices={s: sorted(map(str, logs)) for s, logs in manifest["slices"].items()},
            changes=copy.deepcopy(list(manifest.get("changes", []))),
            retired={str(log) for log in manifest.get("retired_logs", [])},
            uncovered=set(manifest.get("uncovered_slices", [])),
            number=_version_number(str(manifest["version"])),
        )


def _explicit_change(
    slices: dict[str, list[str]],
    new_frames: pd.DataFrame,
    add: list[str],
    remove: list[str],
    excluded: set[str],
    reason: str,
) -> dict[str, Any]:
    """Apply ``add``/``remove`` to ``slices`` in place and describe what changed."""
    current = benchmark_log_ids({"slices": slices})
    unknown = [log for log in remove if log not in current]
    if unknown:
        raise BenchmarkChangeError(f"cannot remove logs that are not in the benchmark: {unknown}")
    trained = [log for log in add if log in excluded]
    if trained:
        raise BenchmarkChangeError(f"cannot hold out logs that training already used: {trained}")
    slice_of = log_slices(new_frames)
    absent = [log for log in add if log not in slice_of]
    if absent:
        raise BenchmarkChangeError(f"logs to add are not in the given frames: {absent}")
    removed: dict[str, list[str]] = {}
    for slice_ in list(slices):
        dropped = [log for log in slices[slice_] if log in remove]
        if dropped:
            removed[slice_] = dropped
            slices[slice_] = [log for log in slices[slice_] if log not in remove]
    added: dict[str, list[str]] = {}
    for log in add:
        if log in current and log not in remove:
            continue
        slice_ = slice_of[log]
        added.setdefault(slice_, []).append(log)
        slices[slice_] = sorted({*slices.get(slice_, []), log})
    return {"kind": CHANGE_EXPLICIT, "reason": reason, "added": added, "removed": removed}
