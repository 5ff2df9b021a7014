"""Which published frames a training dataset is made of — and what the next one would add.

The dataset asset and the retraining sensor must agree exactly on this selection: the sensor
asks "how many accepted badcases would the next dataset contain that the latest one does not",
and if it counted frames the dataset then leaves out (benchmark logs, frames held back by label
QC, excluded conditions) it would request retraining forever. So both call these functions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from aiinfra_pipelines.curation.embeddings import embedding_matrix, published_embeddings
from aiinfra_pipelines.curation.selection import SelectionParams, select_frames
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.io_manager import read_asset_partitions
from aiinfra_pipelines.lake.layout import DATASETS_PREFIX, MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake

from .benchmark import benchmark_log_ids, exclude_benchmark, freeze_benchmark
from .drives import with_drives
from .manifest import dataset_logs
from .settings import DatasetSettings, SelectionSettings, TrainingSelection
from .split import SPLIT_COLUMN

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
# What dataset rows carry: a reference row and the drive it belongs to (datasets.drives), the
# unit splits and the benchmark hold out.
ROW_COLUMNS = [*REFERENCE_COLUMNS, "drive_id"]


def has_ground_truth(index: pd.DataFrame) -> pd.Series:
    """Which scene-index frames carry the simulator's ground truth, so labels can be derived.

    The ground-truth channel carries the lane count, at least 1 on every simulated road; a real
    car's log has no such channel and the reader leaves it 0 (``frame_from_messages``). Labels
    derived from such a frame would be invented (no vehicles, every side lane missing).
    """
    if "lane_count" not in index.columns:
        return pd.Series(True, index=index.index)
    return pd.to_numeric(index["lane_count"], errors="coerce").fillna(0) >= 1


def published_index(lake: VersionedLake) -> pd.DataFrame:
    """The scene index on ``main`` with each log's drive (``drives.log_drives``); raises when
    nothing has been ingested yet."""
    index = scene_index_view(lake)
    if index.empty:
        raise ValueError("no published scene index on main: ingest drive logs first")
    return with_drives(index, DatasetSettings.load().drive_max_gap_s)


def published_frames(lake: VersionedLake) -> pd.DataFrame:
    """Reference rows of every frame published to ``main`` by ingestion that can be labelled
    (``has_ground_truth``): what benchmark and training rows are drawn from."""
    index = published_index(lake)
    return index.loc[has_ground_truth(index), ROW_COLUMNS]


def trained_logs(lake: VersionedLake) -> set[str]:
    """Logs of the latest training dataset (they may never become benchmark members)."""
    latest = lake.get_json_or_none(MAIN_BRANCH, TRAINING_LATEST)
    if latest is None:
        return set()
    return dataset_logs(lake.get_json(latest["commit"], latest["manifest_key"]))


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


def embedding_space(table: pd.DataFrame, candidates: pd.DataFrame) -> str | None:
    """The engine whose embeddings cover every candidate (the first SHA if several do), or
    ``None``: vectors of two engines are not comparable, so one space must hold them all."""
    keyed = candidates[FRAME_KEY].merge(table[[*FRAME_KEY, "engine_sha"]], on=FRAME_KEY)
    covered = keyed.drop_duplicates([*FRAME_KEY, "engine_sha"]).groupby("engine_sha").size()
    complete = sorted(str(sha) for sha, count in covered.items() if count == len(candidates))
    return complete[0] if complete else None


def frame_embeddings(
    table: pd.DataFrame, keys: pd.DataFrame, engine_sha: str
) -> tuple[np.ndarray, np.ndarray]:
    """(row mask of ``keys`` that have an ``engine_sha`` embedding, their vectors in order)."""
    space = table[table["engine_sha"] == engine_sha].drop_duplicates(FRAME_KEY, keep="last")
    space = space.reset_index(drop=True)
    position = keys[FRAME_KEY].merge(space[FRAME_KEY].reset_index(), on=FRAME_KEY, how="left")
    found = position["index"].notna().to_numpy()
    rows = position.loc[found, "index"].to_numpy(dtype=np.int64)
    return found, embedding_matrix(space.iloc[rows])


def _with_embeddings(
    lake: VersionedLake, candidates: pd.DataFrame, base: pd.DataFrame, labels: pd.DataFrame
) -> tuple[dict, str | None]:
    """``select_frames``' embedding arguments for ``candidates`` against ``base`` (empty with
    a reason when the candidates have no common embedding space)."""
    table = published_embeddings(lake, MAIN_BRANCH)
    engine_sha = embedding_space(table, candidates) if len(table) else None
    if engine_sha is None:
        return {}, (
            "no engine's embeddings cover every candidate (mined by an engine exported before "
            "engines carried embeddings, or by several engines): chosen by engine confidence, "
            "slice quotas and clip context only"
        )
    _, embeddings = frame_embeddings(table, candidates, engine_sha)
    base = base.sort_values(FRAME_KEY).reset_index(drop=True)  # the ensemble's bootstrap order
    found, base_embeddings = frame_embeddings(table, base, engine_sha)
    targets = label_targets(labels, base[found]) if found.any() else None
    return {
        "embeddings": embeddings,
        "train_embeddings": base_embeddings if found.any() else None,
        "train_targets": targets,
    }, None


def label_targets(labels: pd.DataFrame, keys: pd.DataFrame) -> np.ndarray | None:
    """Flattened occupancy auto-labels of ``keys``' frames (what the ensemble heads learn)."""
    if labels.empty or "occupancy" not in labels.columns:
        return None
    joined = keys[FRAME_KEY].merge(
        labels.drop_duplicates(FRAME_KEY, keep="last")[[*FRAME_KEY, "occupancy"]],
        on=FRAME_KEY,
        how="left",
    )
    if joined["occupancy"].isna().any():
        return None
    return np.asarray(joined["occupancy"].tolist(), dtype=np.float64)


def budgeted_badcases(
    lake: VersionedLake,
    accepted: pd.DataFrame,
    base: pd.DataFrame,
    context: tuple[pd.DataFrame, pd.DataFrame],
    params: SelectionParams,
    seed: int,
) -> tuple[pd.DataFrame, dict]:
    """The accepted badcases a dataset trains on: all of them while they fit in the budget,
    else ``curation.selection.select_frames``'s choice against the base frames.

    ``context`` is (the mined badcase rows — their engine ``confidence`` —, the auto-labels).
    A pure function of the lake's published state and the seed: the dataset and the
    retraining sensor call it on the same state and get the same frames.
    """
    accepted = accepted.sort_values(FRAME_KEY).reset_index(drop=True)
    if len(accepted) <= params.budget_frames:
        per_slice = accepted["slice"].astype(str).value_counts().sort_index()
        counts = {str(k): {"candidates": int(v), "chosen": int(v)} for k, v in per_slice.items()}
        summary = {"candidates": len(accepted), "budget_frames": params.budget_frames}
        return accepted, {**summary, "chosen": len(accepted), "binding": False, "per_slice": counts}
    mined, labels = context
    mined = mined if "confidence" in mined.columns else mined.assign(confidence=np.nan)
    if "disagreement" not in mined.columns:
        mined = mined.assign(disagreement=np.nan)
    # A frame mined more than once (regular mining, then a shadow disagreement) keeps its
    # lowest confidence and largest label error; one without a confidence (a shadow row) counts
    # as fully unsure. Label errors stay NaN where unknown (the slices' weakness then falls
    # back to uncertainty).
    scores = mined.groupby(FRAME_KEY, as_index=False).agg(
        confidence=("confidence", "min"), disagreement=("disagreement", "max")
    )
    candidates = accepted.merge(scores, on=FRAME_KEY, how="left", validate="one_to_one")
    candidates["confidence"] = candidates["confidence"].fillna(0.0)
    arrays, missing = _with_embeddings(lake, candidates, base, labels)
    selection = select_frames(candidates, params, seed=seed, train_slices=base["slice"], **arrays)
    chosen = accepted.merge(selection.chosen[FRAME_KEY], on=FRAME_KEY)
    summary = {**selection.summary, "binding": True}
    if missing is not None:  # the lake's reason, in place of the generic "no embeddings"
        summary["notes"] = [missing, *summary["notes"][1:]]
    return chosen, summary


def training_rows(
    lake: VersionedLake,
    base_fraction: float,
    seed: int,
    exclude: dict[str, list[str]],
    selection: SelectionParams | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Base frames (a share of ordinary ones) plus the accepted badcases, benchmark excluded.

    Every accepted badcase while they fit in ``selection.budget_frames`` (no ``selection``:
    no budget), else the budgeted selection's choice; ``qc["selection"]`` says which.
    ``qc["unlabelled_rows"]`` (the caller pops it: rows, not a figure) are the reference rows
    of frames without usable labels, with their ``reason``: ``label_qc`` (held back: QC doubts
    the auto-label) or ``no_ground_truth`` (a real car's log). They are never trained on with
    labels; a teacher can read them (``transfer_rows``).
    """
    index = published_index(lake)
    labelled = has_ground_truth(index)
    frames, no_truth = (
        index.loc[labelled, ROW_COLUMNS],
        index.loc[~labelled, ROW_COLUMNS],
    )
    for condition, values in exclude.items():
        frames = frames[~frames[condition].isin(values)]
        no_truth = no_truth[~no_truth[condition].isin(values)]
    benchmark = lake.get_json_or_none(MAIN_BRANCH, BENCHMARK_MANIFEST)
    if benchmark is not None:
        frames = exclude_benchmark(frames, benchmark)
    labels = read_asset_partitions(lake, "auto_labels", MAIN_BRANCH)
    held_back = labels.loc[labels["held_back"], FRAME_KEY] if not labels.empty else labels
    doubted = _in(frames, held_back)
    unlabelled = pd.concat(
        [
            frames[doubted].assign(reason="label_qc"),
            no_truth.assign(reason="no_ground_truth"),
        ]
    )
    frames = frames[~doubted]
    badcases = read_asset_partitions(lake, "mined_badcases", MAIN_BRANCH)
    is_badcase = _in(frames, badcases)
    ordinary = frames[~is_badcase].sample(frac=base_fraction, random_state=seed)
    accepted, summary = budgeted_badcases(
        lake,
        frames[is_badcase],
        ordinary,
        (badcases, labels),
        selection or SelectionParams(budget_frames=max(len(frames), 1)),
        seed,
    )
    rows = pd.concat([accepted.assign(badcase=True), ordinary.assign(badcase=False)])
    qc = {
        "frames_held_back": len(held_back),
        "mean_agreement": float(labels["agreement"].mean()) if not labels.empty else None,
        "frames_without_ground_truth": len(no_truth),
        "selection": summary,
        "unlabelled_rows": unlabelled.sort_values(FRAME_KEY).reset_index(drop=True),
    }
    return rows.sort_values(FRAME_KEY).reset_index(drop=True), qc


def transfer_rows(unlabelled_rows: pd.DataFrame, dataset: pd.DataFrame) -> pd.DataFrame:
    """The dataset's transfer set: frames without usable labels, outside its val logs.

    Label QC doubts their labels, or their log has none; their pixels are fleet data all the
    same. A student distilled from the cloud teacher reads them with the teacher's readings as
    targets (``train_perception_model(transfer_frames=)``), the regime where distillation pays
    (docs/training.md). A val log's frames stay out: the student would otherwise train on the
    logs it is validated on.
    """
    val_logs = set(dataset.loc[dataset[SPLIT_COLUMN] == "val", "log_id"])
    return unlabelled_rows[~unlabelled_rows["log_id"].isin(val_logs)].reset_index(drop=True)


def configured_training_rows(lake: VersionedLake) -> tuple[pd.DataFrame, dict]:
    """``training_rows`` with the settings of ``resources/datasets.yaml`` (``training`` and
    the ``selection`` budget): the one call the dataset and the retraining sensor share."""
    selection = TrainingSelection.load()
    return training_rows(
        lake,
        selection.base_fraction,
        DatasetSettings.load().seed,
        selection.exclude,
        SelectionSettings.load().params,
    )


def latest_training_rows(lake: VersionedLake) -> pd.DataFrame:
    """The rows of the newest ``dataset-vNNNN`` (empty before the first dataset)."""
    latest = lake.get_json_or_none(MAIN_BRANCH, TRAINING_LATEST)
    if latest is None:
        return pd.DataFrame(columns=[*FRAME_KEY, "badcase"])
    return lake.get_parquet(latest["commit"], latest["rows_key"])


def unseen_badcases(lake: VersionedLake) -> pd.DataFrame:
    """Accepted badcase frames the next dataset would train on that the latest one lacks.

    Accepted = mined, not held back by label QC, not benchmark, not an excluded condition, and
    chosen by the budgeted selection when they exceed ``selection.budget_frames``: exactly the
    badcases ``training_dataset`` would include (the same ``configured_training_rows`` call, so
    a badcase the budget leaves out never counts as unseen — else the loop would retrain for
    frames no dataset takes). Empty before any ingestion.
    """
    if scene_index_view(lake).empty:
        return pd.DataFrame(columns=REFERENCE_COLUMNS)
    rows, _ = configured_training_rows(lake)
    badcases = rows[rows["badcase"]]
    seen = latest_training_rows(lake)
    return badcases[~_in(badcases, seen)].reset_index(drop=True)
