"""Which published frames a training dataset is made of — and what the next one would add.

The dataset asset and the retraining sensor must agree exactly on this selection: the sensor
asks "how many accepted badcases would the next dataset contain that the latest one does not",
and if it counted frames the dataset then leaves out (benchmark logs, frames held back by label
QC, excluded conditions) it would request retraining forever. So both call these functions.
"""

from __future__ import annotations

import pandas as pd

from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.io_manager import read_asset_partitions
from aiinfra_pipelines.lake.layout import DATASETS_PREFIX, MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake

from .benchmark import benchmark_log_ids, exclude_benchmark, freeze_benchmark
from .settings import DatasetSettings, TrainingSelection

BENCHMARK_MANIFEST = f"{DATASETS_PREFIX}benchmark/manifest.json"
TRAINING_LATEST = f"{DATASETS_PREFIX}training/latest.json"
FRAME_KEY = ["log_id", "frame_index"]
REFERENCE_COLUMNS = [
    "log_id",
    "frame_index",
    "slice",
    "lighting",
    "weather",
    "road_type",
    "frames_object",
    "source_commit",
]


def published_frames(lake: VersionedLake) -> pd.DataFrame:
    """Reference rows of every frame published to ``main`` by ingestion."""
    index = scene_index_view(lake)
    if index.empty:
        raise ValueError("no published scene index on main: ingest drive logs first")
    return index[REFERENCE_COLUMNS]


def trained_logs(lake: VersionedLake) -> set[str]:
    """Logs of the latest training dataset (they may never become benchmark members)."""
    latest = lake.get_json_or_none(MAIN_BRANCH, TRAINING_LATEST)
    if latest is None:
        return set()
    manifest = lake.get_json(latest["commit"], latest["manifest_key"])
    return {log for logs in manifest["logs"].values() for log in logs}


def next_benchmark_manifest(
    lake: VersionedLake,
    frames: pd.DataFrame,
    *,
    add_logs: list[str] | tuple[str, ...] = (),
    remove_logs: list[str] | tuple[str, ...] = (),
    reason: str | None = None,
) -> tuple[dict | None, dict]:
    """(the benchmark manifest on ``main``, the one ``benchmark_set`` would write next).

    One function for the asset and the retraining sensor, so the sensor's "would a candidate
    have anything to be evaluated on" is the asset's own selection, not an estimate.
    """
    settings = DatasetSettings.load()
    existing = lake.get_json_or_none(MAIN_BRANCH, BENCHMARK_MANIFEST)
    manifest = freeze_benchmark(
        existing,
        frames,
        fraction=settings.benchmark_fraction,
        seed=settings.seed,
        min_logs_per_slice=settings.min_benchmark_logs_per_slice,
        exclude_logs=trained_logs(lake),
        add_logs=add_logs,
        remove_logs=remove_logs,
        reason=reason,
    )
    return existing, manifest


def logs_in_use(lake: VersionedLake) -> frozenset[str]:
    """Logs the latest training dataset trained on or the benchmark holds out: retraining
    cannot learn anything new from them."""
    used: set[str] = set()
    latest = lake.get_json_or_none(MAIN_BRANCH, TRAINING_LATEST)
    if latest is not None:
        rows = lake.get_parquet(latest["commit"], latest["rows_key"], columns=["log_id"])
        used |= set(rows["log_id"].astype(str))
    benchmark = lake.get_json_or_none(MAIN_BRANCH, BENCHMARK_MANIFEST)
    if benchmark is not None:
        used |= {str(log_id) for log_id in benchmark_log_ids(benchmark)}
    return frozenset(used)


def benchmark_not_ready(lake: VersionedLake) -> str | None:
    """Why no candidate could be evaluated yet, or ``None`` when the benchmark has logs.

    A benchmark log is held out per slice only once the slice has a second log (one stays for
    training), so a young lake where every slice has been driven once has nothing to score a
    candidate on; training then would only produce a run that fails at ``offline_eval``.
    """
    existing = lake.get_json_or_none(MAIN_BRANCH, BENCHMARK_MANIFEST)
    if existing is not None and benchmark_log_ids(existing):
        return None
    _, manifest = next_benchmark_manifest(lake, published_frames(lake))
    if benchmark_log_ids(manifest):
        return None
    slices = len(manifest["uncovered_slices"])
    return (
        f"the benchmark would hold no log yet: none of the {slices} slice(s) seen has a second "
        "log to hold out, so a candidate could not be evaluated; waiting for more drives"
    )


def _in(frames: pd.DataFrame, keys: pd.DataFrame) -> pd.Series:
    """Row mask: the frame's (log_id, frame_index) is one of ``keys``."""
    if keys.empty or frames.empty:
        return pd.Series(False, index=frames.index)
    wanted = pd.MultiIndex.from_frame(keys[FRAME_KEY])
    return pd.Series(pd.MultiIndex.from_frame(frames[FRAME_KEY]).isin(wanted), index=frames.index)


def training_rows(
    lake: VersionedLake, base_fraction: float, seed: int, exclude: dict[str, list[str]]
) -> tuple[pd.DataFrame, dict]:
    """Base frames (a share of ordinary ones) plus every accepted badcase, benchmark excluded."""
    frames = published_frames(lake)
    for condition, values in exclude.items():
        frames = frames[~frames[condition].isin(values)]
    benchmark = lake.get_json_or_none(MAIN_BRANCH, BENCHMARK_MANIFEST)
    if benchmark is not None:
        frames = exclude_benchmark(frames, benchmark)
    labels = read_asset_partitions(lake, "auto_labels", MAIN_BRANCH)
    held_back = labels.loc[labels["held_back"], FRAME_KEY] if not labels.empty else labels
    frames = frames[~_in(frames, held_back)]
    badcases = read_asset_partitions(lake, "mined_badcases", MAIN_BRANCH)
    is_badcase = _in(frames, badcases)
    ordinary = frames[~is_badcase].sample(frac=base_fraction, random_state=seed)
    rows = pd.concat([frames[is_badcase].assign(badcase=True), ordinary.assign(badcase=False)])
    qc = {
        "frames_held_back": len(held_back),
        "mean_agreement": float(labels["agreement"].mean()) if not labels.empty else None,
    }
    return rows.sort_values(FRAME_KEY).reset_index(drop=True), qc


def configured_training_rows(lake: VersionedLake) -> tuple[pd.DataFrame, dict]:
    """``training_rows`` with the settings of ``resources/datasets.yaml``."""
    selection = TrainingSelection.load()
    return training_rows(
        lake, selection.base_fraction, DatasetSettings.load().seed, selection.exclude
    )


def latest_training_rows(lake: VersionedLake) -> pd.DataFrame:
    """The rows of the newest ``dataset-vNNNN`` (empty before the first dataset)."""
    latest = lake.get_json_or_none(MAIN_BRANCH, TRAINING_LATEST)
    if latest is None:
        return pd.DataFrame(columns=[*FRAME_KEY, "badcase"])
    return lake.get_parquet(latest["commit"], latest["rows_key"])


def unseen_badcases(lake: VersionedLake) -> pd.DataFrame:
    """Accepted badcase frames the next dataset would train on that the latest one lacks.

    Accepted = mined, not held back by label QC, not benchmark, not an excluded condition:
    exactly the badcases ``training_dataset`` would include. Empty before any ingestion.
    """
    if scene_index_view(lake).empty:
        return pd.DataFrame(columns=REFERENCE_COLUMNS)
    rows, _ = configured_training_rows(lake)
    badcases = rows[rows["badcase"]]
    seen = latest_training_rows(lake)
    return badcases[~_in(badcases, seen)].reset_index(drop=True)
