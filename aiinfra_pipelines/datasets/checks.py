"""Data health of every training dataset version, as asset checks on ``training_dataset``.

* ``label_errors`` (WARN): frames whose auto-label confident learning doubts, ranked;
* ``near_duplicates`` (WARN): training frames that are perceptual copies of a frame of
  another log;
* ``split_leaks`` (ERROR): training frames that are perceptual copies of benchmark frames.

None of them blocks. Label errors and duplicates are for a person to review. A leak is worse —
the benchmark would score data the model trained on, flattering the offline gate — but the
dataset is already published and tagged when its checks run, so a block would only stop the
training run, and a 64-bit hash of the low frequencies can pair two different pictures (on
highway-env renders, frames of one road with different traffic come within 4 bits; flat fog
frames have fragile hashes). Stopping the autonomous loop on such a match, with no one to rule
on it, costs more than a red ERROR in the UI that names the pairs and the benchmark version.
(The leaks it does find are real: the simulator cuts one drive into consecutive logs, and the
benchmark, held out by log, can take one of two logs that meet at the same picture.)
Thresholds: ``datasets.yaml`` ``data_health``. One op computes all three: frames are read once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import numpy as np
import pandas as pd

from aiinfra_pipelines.curation import data_health as health
from aiinfra_pipelines.curation.embeddings import embedding_matrix, published_embeddings
from aiinfra_pipelines.curation.label_errors import find_label_errors
from aiinfra_pipelines.lake.io_manager import read_asset_partitions
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.perception.contract import perception_spec

from .assets import training_dataset
from .selection import BENCHMARK_MANIFEST, FRAME_KEY, TRAINING_LATEST
from .settings import DataHealthSettings

LABEL_ERRORS = "label_errors"
NEAR_DUPLICATES = "near_duplicates"
SPLIT_LEAKS = "split_leaks"


@dataclass(frozen=True)
class DatasetUnderCheck:
    """The latest training dataset: its rows, commit, and the benchmark frames beside it."""

    version: str
    commit: str
    rows: pd.DataFrame
    benchmark_version: str | None
    benchmark: pd.DataFrame


def dataset_under_check(lake: VersionedLake) -> DatasetUnderCheck:
    """The dataset ``training_latest`` names on ``main``, read at its own commit."""
    pointer = lake.get_json_or_none(MAIN_BRANCH, TRAINING_LATEST)
    if pointer is None:
        raise ValueError("no training dataset on main: materialize training_dataset first")
    commit = pointer["commit"]
    rows = lake.get_parquet(commit, pointer["rows_key"])
    manifest = lake.get_json_or_none(commit, BENCHMARK_MANIFEST)
    if manifest is None or not manifest.get("frames_key"):
        benchmark, version = rows.iloc[0:0], None
    else:
        benchmark, version = lake.get_parquet(commit, manifest["frames_key"]), manifest["version"]
    return DatasetUnderCheck(pointer["version"], commit, rows, version, benchmark)


def engine_embeddings(
    lake: VersionedLake, keys: pd.DataFrame, ref: str
) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(embeddings of the covered frames, row mask of ``keys`` covered, engine sha) for the one
    engine that embedded most of ``keys``, or ``None`` when none has embeddings.

    One engine only: vectors of two engines live in different spaces. A dataset spans batches
    mined by different deployed engines, so the best engine may cover only part of it.
    """
    table = published_embeddings(lake, ref)
    best: tuple[np.ndarray, np.ndarray, str] | None = None
    for engine, rows in table.groupby("engine_sha", sort=True):
        rows = rows.drop_duplicates(FRAME_KEY, keep="last").reset_index(drop=True)
        position = keys[FRAME_KEY].merge(rows[FRAME_KEY].reset_index(), on=FRAME_KEY, how="left")
        covered = position["index"].notna().to_numpy()
        if best is None or covered.sum() > best[1].sum():
            picked = position.loc[covered, "index"].to_numpy(dtype=np.int64)
            best = (embedding_matrix(rows)[picked], covered, str(engine))
    return best if best is not None and best[1].any() else None


def _label_features(
    lake: VersionedLake,
    keys: pd.DataFrame,
    thumbnails: np.ndarray,
    ref: str,
    settings: DataHealthSettings,
) -> tuple[np.ndarray, np.ndarray, str]:
    """(features, mask of ``keys`` they cover, what they are): the deployed engine's embeddings
    when one engine embedded at least ``min_embedding_coverage`` of the frames (only those
    frames are judged), else the grey thumbnail of every frame."""
    found = engine_embeddings(lake, keys, ref)
    if found is not None and found[1].mean() >= settings.min_embedding_coverage:
        vectors, covered, engine = found
        note = f"engine embeddings ({engine[:12]}, {vectors.shape[1]} dims)"
        return vectors, covered, note
    rows, columns = settings.fallback_thumbnail
    share = 0.0 if found is None else float(found[1].mean())
    note = f"grey thumbnail {rows}x{columns} (engine embeddings for {share:.0%} of the frames)"
    return thumbnails, np.ones(len(keys), dtype=bool), note


def label_error_result(
    lake: VersionedLake,
    dataset: DatasetUnderCheck,
    signals: health.FrameSignals,
    settings: DataHealthSettings,
) -> dg.AssetCheckResult:
    """``label_errors``: confident learning over the dataset's auto-labels (module docstring)."""
    labels = read_asset_partitions(lake, "auto_labels", dataset.commit)
    if labels.empty:
        return _not_judged(dataset, "no auto-labels published for the dataset's frames")
    cells, labelled = health.occupancy_matrix(labels, signals.keys)
    keys = signals.keys[labelled].reset_index(drop=True)
    features, covered, feature_note = _label_features(
        lake, keys, signals.thumbnails[labelled], dataset.commit, settings
    )
    keys, cells = keys[covered].reset_index(drop=True), cells[covered]
    logs = keys["log_id"].nunique()
    if logs < settings.cross_fit.folds:
        return _not_judged(
            dataset, f"{logs} labelled log(s): cross-fitting needs {settings.cross_fit.folds}"
        )
    report = find_label_errors(
        features,
        cells,
        keys["log_id"].to_numpy(),
        health.cell_names(perception_spec().bin_edges_m),
        settings.cross_fit,
        min_cell_auc=settings.min_cell_auc,
        min_margin=settings.min_margin,
    )
    table = pd.concat(
        [keys.iloc[report.table["row"]].reset_index(drop=True), report.table.drop(columns="row")],
        axis=1,
    )
    judged = bool(report.judged_cells)
    return dg.AssetCheckResult(
        check_name=LABEL_ERRORS,
        asset_key=training_dataset.key,
        passed=judged and report.rate <= settings.max_label_error_rate,
        severity=dg.AssetCheckSeverity.WARN,
        description=None
        if judged
        else f"no occupancy cell reaches out-of-fold AUC {settings.min_cell_auc}: not judged",
        metadata={
            "dataset_version": dataset.version,
            "features": feature_note,
            "frames_judged": len(keys),
            "frames_without_label": int((~labelled).sum()),
            "frames_not_embedded": int((~covered).sum()),
            "suspected_frames": len(table),
            "suspected_labels": report.suspected_labels,
            "rate": float(round(report.rate, 4)),
            "max_rate": settings.max_label_error_rate,
            "judged_cells": dg.MetadataValue.json(report.judged_cells),
            "cell_auc": dg.MetadataValue.json(report.cell_auc),
            "ranked": dg.MetadataValue.md(health.markdown(table, settings.max_rows)),
        },
    )


def _not_judged(dataset: DatasetUnderCheck, reason: str) -> dg.AssetCheckResult:
    """Labels that cannot be judged are not labels that were checked: a failed warning."""
    return dg.AssetCheckResult(
        check_name=LABEL_ERRORS,
        asset_key=training_dataset.key,
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        description=reason,
        metadata={"dataset_version": dataset.version, "not_judged": reason},
    )


def duplicate_result(
    dataset: DatasetUnderCheck, signals: health.FrameSignals, settings: DataHealthSettings
) -> dg.AssetCheckResult:
    """``near_duplicates``: training frames with a perceptual copy (another log's, by default)."""
    pairs = health.near_duplicates(
        signals, settings.duplicate_distance, settings.duplicate_same_log
    )
    frames = health.frames_in_pairs(pairs)
    rate = frames / len(signals.keys) if len(signals.keys) else 0.0
    return dg.AssetCheckResult(
        check_name=NEAR_DUPLICATES,
        asset_key=training_dataset.key,
        passed=rate <= settings.max_duplicate_rate,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "dataset_version": dataset.version,
            "pairs": len(pairs),
            "frames_with_duplicate": frames,
            "rate": float(round(rate, 4)),
            "max_rate": settings.max_duplicate_rate,
            "max_distance": settings.duplicate_distance,
            "pairs_table": dg.MetadataValue.md(health.markdown(pairs, settings.max_rows)),
        },
    )


def leak_result(
    dataset: DatasetUnderCheck,
    training: health.FrameSignals,
    benchmark: health.FrameSignals,
    settings: DataHealthSettings,
) -> dg.AssetCheckResult:
    """``split_leaks``: any training frame that is a perceptual copy of a benchmark frame."""
    pairs = health.split_leaks(training, benchmark, settings.leak_distance)
    return dg.AssetCheckResult(
        check_name=SPLIT_LEAKS,
        asset_key=training_dataset.key,
        passed=pairs.empty,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "dataset_version": dataset.version,
            "benchmark_version": dataset.benchmark_version or "none",
            "benchmark_frames": len(benchmark.keys),
            "leaking_pairs": len(pairs),
            "leaking_training_frames": len(
                pairs[["log_id_training", "frame_index_training"]].drop_duplicates()
            ),
            "max_distance": settings.leak_distance,
            "pairs_table": dg.MetadataValue.md(health.markdown(pairs, settings.max_rows)),
        },
    )


def data_health_results(
    lake: VersionedLake, settings: DataHealthSettings
) -> Iterator[dg.AssetCheckResult]:
    """The three results for the latest training dataset (plain function: the check's body)."""
    dataset = dataset_under_check(lake)
    training = health.frame_signals(
        lake, dataset.rows, dataset.commit, thumbnail=settings.fallback_thumbnail
    )
    benchmark = health.frame_signals(lake, dataset.benchmark, dataset.commit)
    yield label_error_result(lake, dataset, training, settings)
    yield duplicate_result(dataset, training, settings)
    yield leak_result(dataset, training, benchmark, settings)


@dg.multi_asset_check(
    specs=[
        dg.AssetCheckSpec(
            LABEL_ERRORS,
            asset=training_dataset,
            blocking=False,
            description="Auto-labels that confident learning on out-of-fold predictions doubts.",
        ),
        dg.AssetCheckSpec(
            NEAR_DUPLICATES,
            asset=training_dataset,
            blocking=False,
            description="Training frames that are perceptual-hash copies of another log's frame.",
        ),
        dg.AssetCheckSpec(
            SPLIT_LEAKS,
            asset=training_dataset,
            blocking=False,
            description="Training frames that are perceptual-hash copies of benchmark frames.",
        ),
    ],
)
def training_dataset_health(lake: VersionedLake) -> Iterator[dg.AssetCheckResult]:
    """Label errors, near-duplicates and split leaks of the latest training dataset."""
    yield from data_health_results(lake, DataHealthSettings.load())
