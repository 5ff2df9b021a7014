"""Dataset manifests and ``dataset-vNNNN`` version tags.

The manifest travels with the dataset commit in the lake: it says what the dataset is made of
(frames and logs per split and slice, the lake commits it was built from, label-QC results) so
a model's MLflow run can be traced back to exactly those inputs without reading the data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from .grouping import LOG_COLUMN, SLICE_COLUMN, require_columns
from .split import SPLIT_COLUMN, assert_disjoint_logs

DATASET_TAG_PREFIX = "dataset-v"
_TAG_PATTERN = re.compile(rf"^{re.escape(DATASET_TAG_PREFIX)}(\d+)$")


def build_manifest(
    dataset: pd.DataFrame,
    *,
    source_commits: list[str],
    label_qc: Mapping[str, Any],
    version: str,
) -> dict[str, Any]:
    """A JSON-ready description of a split dataset (``log_id``, ``slice``, ``split`` columns).

    Checks log disjointness first: a manifest must never describe a leaking dataset. Keys:
    ``version``, ``frames``, ``frames_per_split``, ``counts`` (``split → slice → frames``),
    ``logs`` (``split → sorted log ids``), ``log_counts``, ``slices``, ``source_commits``,
    ``label_qc``.
    """
    require_columns(dataset, (LOG_COLUMN, SLICE_COLUMN, SPLIT_COLUMN), "build_manifest")
    assert_disjoint_logs(dataset)
    counts: dict[str, dict[str, int]] = {}
    logs: dict[str, list[str]] = {}
    for split, group in dataset.groupby(SPLIT_COLUMN, sort=True):
        counts[str(split)] = {
            str(slice_): int(n)
            for slice_, n in group[SLICE_COLUMN].value_counts().sort_index().items()
        }
        logs[str(split)] = sorted(group[LOG_COLUMN].astype(str).unique())
    return {
        "version": str(version),
        "frames": len(dataset),
        "frames_per_split": {split: sum(per.values()) for split, per in counts.items()},
        "counts": counts,
        "logs": logs,
        "log_counts": {split: len(ids) for split, ids in logs.items()},
        "slices": sorted(dataset[SLICE_COLUMN].astype(str).unique()),
        "source_commits": [str(commit) for commit in source_commits],
        "label_qc": dict(label_qc),
    }


def add_transfer_set(
    manifest: dict[str, Any], transfer: pd.DataFrame, rows_key: str
) -> dict[str, Any]:
    """``manifest`` with its transfer set (``transfer``: reference rows with ``log_id``,
    ``source_commit`` and ``reason``): count, logs, rows key and counts by reason under
    ``transfer``, and its source commits joined to ``source_commits`` so retention keeps the
    raw data its frames came from."""
    commits = set(manifest["source_commits"]) | set(transfer["source_commit"].astype(str))
    by_reason = transfer["reason"].value_counts()
    return {
        **manifest,
        "source_commits": sorted(commits),
        "transfer": {
            "frames": len(transfer),
            "logs": sorted(transfer[LOG_COLUMN].astype(str).unique()),
            "rows_key": rows_key,
            "by_reason": {str(reason): int(n) for reason, n in by_reason.items()},
        },
    }


def dataset_logs(manifest: Mapping[str, Any]) -> set[str]:
    """Every log a dataset version trains on: its splits' and its transfer set's."""
    logs = {str(log) for split in (manifest.get("logs") or {}).values() for log in split}
    return logs | {str(log) for log in (manifest.get("transfer") or {}).get("logs", [])}


def next_dataset_version(existing_tags: Iterable[str]) -> str:
    """The next ``dataset-vNNNN`` after the highest existing one (``dataset-v0001`` first).

    Other tags on the repository (releases, benchmarks, malformed names) are ignored; numbering
    follows the maximum, not the count, so a deleted tag never gets its number reused.
    """
    numbers = [int(match.group(1)) for tag in existing_tags if (match := _TAG_PATTERN.match(tag))]
    return f"{DATASET_TAG_PREFIX}{max(numbers, default=0) + 1:04d}"
