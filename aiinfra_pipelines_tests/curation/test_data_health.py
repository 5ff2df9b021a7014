"""Data health: label errors by confident learning, perceptual hashes, and the asset checks
on ``training_dataset`` that report them (run through ``dg.materialize``)."""

from __future__ import annotations

import uuid

import dagster as dg
import numpy as np
import pandas as pd
import pytest
import yaml

from aiinfra_pipelines.config import SettingsError, resources_dir
from aiinfra_pipelines.curation.embeddings import FRAME_EMBEDDINGS_PREFIX
from aiinfra_pipelines.curation.label_errors import (
    CrossFitSettings,
    confident_learning,
    find_label_errors,
    log_folds,
    out_of_fold_probabilities,
    ranked_label_errors,
    roc_auc,
)
from aiinfra_pipelines.curation.perceptual_hash import hamming, near_pairs, phash
from aiinfra_pipelines.datasets.assets import benchmark_set, training_dataset
from aiinfra_pipelines.datasets.benchmark import benchmark_log_ids
from aiinfra_pipelines.datasets.checks import engine_embeddings, training_dataset_health
from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.datasets.selection import (
    BENCHMARK_MANIFEST,
    TRAINING_LATEST,
    has_ground_truth,
    published_frames,
)
from aiinfra_pipelines.datasets.settings import DataHealthSettings
from aiinfra_pipelines.ingest.tables import scene_index_table, trigger_rule_names
from aiinfra_pipelines.lake.io_manager import asset_object_base, parquet_bytes
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines.mining.embeddings import embedding_table
from aiinfra_pipelines.perception.contract import decode_images, perception_spec
from aiinfra_pipelines.perception.labels import ground_truth_labels

SETTINGS = DataHealthSettings.load()
CROSS_FIT = CrossFitSettings(folds=5, components=0, l2=1e-3, iterations=200, seed=0)


# ------------------------------------------------------------------------------ label errors
def synthetic_task(seed: int = 0, flips: int = 30):
    """1200 frames of 40 logs, 6 binary cells linear in 12 features; ``flips`` single-cell
    labels flipped at random frames."""
    rng = np.random.default_rng(seed)
    n, logs, dims, cells = 1200, 40, 12, 6
    groups = np.repeat([f"log{i:02d}" for i in range(logs)], n // logs)
    features = rng.normal(size=(n, dims))
    logits = features @ rng.normal(size=(dims, cells)) / np.sqrt(dims)
    clean = (4.0 * logits + rng.normal(0, 0.2, (n, cells)) > 0).astype(float)
    rows = rng.choice(n, flips, replace=False)
    columns = rng.integers(0, cells, flips)
    noisy = clean.copy()
    noisy[rows, columns] = 1.0 - noisy[rows, columns]
    return features, clean, noisy, groups, set(zip(rows.tolist(), columns.tolist(), strict=True))


def test_folds_keep_every_log_in_one_fold_and_balance_frames():
    groups = np.array(["a"] * 10 + ["b"] * 6 + ["c"] * 5 + ["d"] * 4 + ["e"] * 1)
    folds = log_folds(groups, 3, seed=0)
    for log in set(groups):
        assert len(set(folds[groups == log])) == 1
    assert sorted(np.bincount(folds)) == [7, 9, 10]  # greedy: largest log to lightest fold
    assert (folds == log_folds(groups[::-1], 3, seed=0)[::-1]).all()  # order-independent
    with pytest.raises(ValueError, match="by log"):
        log_folds(np.array(["a", "b"]), 3, seed=0)


def test_flipped_labels_rank_at_the_top():
    features, clean, noisy, groups, flipped = synthetic_task()
    probabilities = out_of_fold_probabilities(features, noisy, groups, CROSS_FIT)
    result = confident_learning(probabilities, noisy)
    table = ranked_label_errors(result, noisy, [f"c{i}" for i in range(6)])
    flagged_cells = {(int(r), int(c)) for r, c in zip(*np.nonzero(result.issues), strict=True)}
    top = table.head(len(flipped))
    recall_at_k = len({row for row, _ in flipped} & set(top["row"])) / len(flipped)
    # Measured (seed 0): 28 of the 30 flipped frames are in the top 30 rows (recall@30 =
    # 0.933); 28 of the 30 flipped cells are flagged, and 7 clean cells besides. The two
    # missed flips sit on the model's decision boundary (p = 0.5 and 0.66).
    assert recall_at_k >= 0.85, recall_at_k
    assert len(flipped & flagged_cells) >= 0.85 * len(flipped)
    assert len(flagged_cells - flipped) <= 10
    assert table["score"].is_monotonic_decreasing and (table["score"] > 0).all()
    # Each table row names its flagged cells with given and suspected labels.
    first = table.iloc[0]
    cell = int(first["cells"].split(",")[0][1:])
    given = "occupied" if noisy[first["row"], cell] else "free"
    assert first["given"].split(", ")[0] == given != first["suspected"].split(", ")[0]
    # The clean labels: the same model finds nothing (measured: 0 cells).
    clean_result = confident_learning(
        out_of_fold_probabilities(features, clean, groups, CROSS_FIT), clean
    )
    assert clean_result.issues.sum() <= 2


def test_gates_judge_only_cells_the_model_separates():
    features, _, noisy, groups, flipped = synthetic_task(flips=20)
    noise = np.random.default_rng(1).integers(0, 2, (len(noisy), 1)).astype(float)
    labels = np.hstack([noisy, noise])  # a 7th cell no feature predicts
    report = find_label_errors(
        features,
        labels,
        groups,
        [f"c{i}" for i in range(7)],
        CROSS_FIT,
        min_cell_auc=0.85,
        min_margin=0.5,
    )
    assert report.judged_cells == [f"c{i}" for i in range(6)]
    assert report.cell_auc["c6"] < 0.6
    assert "c6" not in ",".join(report.table["cells"])
    assert report.judged_labels == len(labels) * 6
    # Measured: 17 labels suspected with margin >= 0.5 for the 20 flips, rate 0.0024.
    assert 0 < report.rate < 0.01 and report.suspected_labels >= 0.8 * len(flipped)
    suspected_rows = set(report.table["row"])
    assert len(suspected_rows & {row for row, _ in flipped}) >= 0.8 * len(flipped)


def test_roc_auc_and_bad_inputs():
    assert roc_auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == 0.75
    assert roc_auc(np.array([0.5, 0.5]), np.array([0, 1])) == 0.5
    assert np.isnan(roc_auc(np.array([0.1, 0.2]), np.array([1, 1])))
    with pytest.raises(ValueError, match="binary"):
        out_of_fold_probabilities(np.zeros((4, 2)), np.full((4, 1), 0.5), np.arange(4), CROSS_FIT)
    with pytest.raises(ValueError, match="at least 2 folds"):
        CrossFitSettings(folds=1, components=0, l2=0.0, iterations=1, seed=0)


# --------------------------------------------------------------------------- perceptual hash
def fleet_table() -> pd.DataFrame:
    """8 highway-env episodes, 13 logs, 392 frames (cached per process; the datasets tests'
    ``fleet`` fixture builds the same one)."""
    from aiinfra_pipelines_tests.support.fleet_data import fleet_frames

    return fleet_frames(4, 2, 0)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    """Real fleet frames (highway-env renders), decoded."""
    fleet = fleet_table()
    return decode_images(list(fleet["image"]), *fleet[["image_height", "image_width"]].iloc[0])


def test_identical_and_slightly_noised_copies_match_different_frames_do_not(images):
    rng = np.random.default_rng(0)
    hashes = phash(images)
    noisy = np.clip(images + rng.normal(0, 1.0, images.shape), 0, 255).astype(np.uint8)
    brighter = np.clip(images.astype(np.int16) + 12, 0, 255).astype(np.uint8)
    assert (phash(images.copy()) == hashes).all()
    assert (hamming(phash(brighter), hashes) <= SETTINGS.leak_distance).mean() >= 0.95
    noise_distance = hamming(phash(noisy), hashes)
    # Measured on these 392 frames: median 0, 90th percentile 2; the misses are flat fog
    # frames, whose low frequencies sit near their median.
    assert np.median(noise_distance) <= 1
    assert (noise_distance <= SETTINGS.leak_distance).mean() >= 0.9
    # Frames of different drives: far apart, almost never within the leak threshold.
    logs = fleet_table()["log_id"].to_numpy()
    i, j = np.triu_indices(len(hashes), k=1)
    across = logs[i] != logs[j]
    distance = hamming(hashes[i[across]], hashes[j[across]])
    assert np.median(distance) >= 20
    assert (distance <= SETTINGS.leak_distance).mean() < 1e-3  # measured: 1 of ~70k pairs


def test_near_pairs_match_brute_force_within_and_across_sets():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**62, 300, dtype=np.uint64)
    one_bit = base[:40] ^ (np.uint64(1) << rng.integers(0, 64, 40).astype(np.uint64))
    hashes = np.concatenate([base, one_bit, base[:5]])
    other = np.concatenate([rng.integers(0, 2**62, 200, dtype=np.uint64), base[100:110]])
    for distance in (0, 2, 3):
        pairs = near_pairs(hashes, distance)
        full = hamming(hashes[:, None], hashes[None, :])
        i, j = np.triu_indices(len(hashes), k=1)
        close = full[i, j] <= distance
        assert set(zip(pairs.left, pairs.right, strict=True)) == set(
            zip(i[close], j[close], strict=True)
        )
        assert (pairs.distance == full[pairs.left, pairs.right]).all()
        across = near_pairs(hashes, distance, other=other)
        close_across = np.nonzero(hamming(hashes[:, None], other[None, :]) <= distance)
        expected = set(zip(*close_across, strict=True))
        assert set(zip(across.left, across.right, strict=True)) == expected
    with pytest.raises(ValueError, match="max_distance"):
        near_pairs(hashes, 64)


# ----------------------------------------------------------------------------- asset checks
FRAME_COLUMNS_DROPPED = ["weather", "lighting", "road_type", "slice", "events"]


def frames_key(log_id: str) -> str:
    return asset_object_base(dg.AssetKey("anonymized_frames"), f"test/{log_id}") + ".parquet"


def publish(lake: LocalLake, objects: dict[str, bytes], message: str) -> None:
    publish_objects(lake, f"test-{uuid.uuid4().hex[:12]}", objects, message, {})


def publish_fleet(lake: LocalLake, fleet: pd.DataFrame) -> None:
    """Frames, scene index and auto-labels of every log on ``main``, at the keys ingestion
    and mining publish them (labels by the real teacher, ``ground_truth_labels``)."""
    objects, index, labels = {}, [], []
    rules = trigger_rule_names()
    for log_id, log in fleet.groupby("log_id", sort=True):
        frames = log.drop(columns=FRAME_COLUMNS_DROPPED).reset_index(drop=True)
        objects[frames_key(log_id)] = parquet_bytes(frames)
        tags = {"log_id": log_id, **log.iloc[0][["weather", "lighting", "road_type"]].to_dict()}
        index.append(
            scene_index_table(
                frames,
                tags=tags,
                events=[],
                rule_names=rules,
                source_branch="ingest-test",
                source_commit="0" * 64,
                log_key=f"logs/{log_id}.mcap",
                frames_object=frames_key(log_id),
            )
        )
        occupancy, lead_gap = ground_truth_labels(frames, perception_spec())
        labels.append(
            frames[["log_id", "frame_index"]].assign(
                occupancy=[cells.ravel().tolist() for cells in occupancy],
                lead_gap_norm=lead_gap,
                agreement=1.0,
                held_back=False,
            )
        )
    partition = "test"
    objects[asset_object_base(dg.AssetKey("scene_index"), partition) + ".parquet"] = parquet_bytes(
        pd.concat(index, ignore_index=True)
    )
    objects[auto_labels_key()] = parquet_bytes(pd.concat(labels, ignore_index=True))
    publish(lake, objects, "fleet frames, scene index and auto-labels")


def auto_labels_key() -> str:
    return asset_object_base(dg.AssetKey("auto_labels"), "test") + ".parquet"


def publish_engine_embeddings(lake: LocalLake, fleet: pd.DataFrame) -> None:
    """Embeddings as mining records them, from a stand-in for a trained engine: a noisy
    linear image of what the frame truly holds (its ground-truth occupancy)."""
    occupancy, _ = ground_truth_labels(fleet, perception_spec())
    rng = np.random.default_rng(0)
    truth = occupancy.reshape(len(fleet), -1)
    vectors = truth @ rng.normal(size=(truth.shape[1], 16)) + rng.normal(0, 0.3, (len(fleet), 16))
    table = embedding_table(fleet, vectors, engine_sha="e" * 64)
    publish(lake, {f"{FRAME_EMBEDDINGS_PREFIX}test.parquet": parquet_bytes(table)}, "embeddings")


def without_segment_boundaries(fleet: pd.DataFrame, frames: int = 5) -> pd.DataFrame:
    """The fleet less the first ``frames`` frames of each log that continues its vehicle's
    previous log: the simulator cuts one drive into consecutive logs, and the frame either side
    of a cut is the same picture (a real split leak when the benchmark takes one of the two)."""
    starts = fleet.groupby("log_id")["timestamp_ns"].agg(["min", "max"])
    starts["vehicle"] = fleet.groupby("log_id")["vehicle_pseudonym"].first()
    starts = starts.sort_values(["vehicle", "min"])
    previous_end = starts.groupby("vehicle")["max"].shift()
    gap_s = (starts["min"] - previous_end) / 1e9
    continuations = set(starts.index[gap_s < 1.0])
    cut = fleet["log_id"].isin(continuations) & (fleet["frame_index"] < frames)
    return fleet[~cut]


@pytest.fixture
def fleet_lake(tmp_path, instance):
    """The fleet, its auto-labels and engine embeddings on ``main``, and a benchmark."""

    def build(fleet: pd.DataFrame) -> LocalLake:
        lake = LocalLake(root=str(tmp_path / "lake"))
        lake.ensure_repository()
        publish_fleet(lake, fleet)
        publish_engine_embeddings(lake, fleet)
        result = dg.materialize([benchmark_set], instance=instance, resources={"lake": lake})
        assert result.success
        return lake

    return build


def check_dataset(lake: LocalLake, instance) -> dict[str, dg.AssetCheckEvaluation]:
    result = dg.materialize(
        [training_dataset, training_dataset_health], instance=instance, resources={"lake": lake}
    )
    assert result.success
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def roles(lake: LocalLake) -> tuple[str, list[str]]:
    """(a benchmark log, the training logs) of the lake's benchmark."""
    manifest = lake.get_json(MAIN_BRANCH, BENCHMARK_MANIFEST)
    held_out = sorted(benchmark_log_ids(manifest))
    training = sorted(set(fleet_table()["log_id"]) - set(held_out))
    return held_out[0], training


def replace_images(lake: LocalLake, log_id: str, images: dict[int, bytes]) -> None:
    """Rewrite frames of one log on ``main`` (frame index → new rgb8 bytes)."""
    frames = lake.get_parquet(MAIN_BRANCH, frames_key(log_id))
    for frame_index, image in images.items():
        frames.loc[frames["frame_index"] == frame_index, "image"] = image
    publish(lake, {frames_key(log_id): parquet_bytes(frames)}, f"rewrite {log_id}")


def test_a_clean_dataset_passes_every_health_check(fleet_lake, instance):
    lake = fleet_lake(without_segment_boundaries(fleet_table()))
    checks = check_dataset(lake, instance)
    assert set(checks) == {"label_errors", "near_duplicates", "split_leaks"}
    for name, evaluation in checks.items():
        assert evaluation.passed, (name, evaluation.metadata)
    labels = checks["label_errors"].metadata
    assert labels["features"].value.startswith("engine embeddings (eeeeeeeeeeee, 16 dims)")
    assert labels["judged_cells"].value and labels["rate"].value <= SETTINGS.max_label_error_rate
    assert checks["split_leaks"].metadata["benchmark_frames"].value > 0
    pointer = lake.get_json(MAIN_BRANCH, TRAINING_LATEST)
    assert labels["dataset_version"].value == pointer["version"]


def scene_index_key() -> str:
    return asset_object_base(dg.AssetKey("scene_index"), "test") + ".parquet"


def test_frames_without_usable_labels_become_the_datasets_transfer_set_outside_val_logs(
    fleet_lake, instance
):
    lake = fleet_lake(fleet_table())
    _, training_logs = roles(lake)
    labels = lake.get_parquet(MAIN_BRANCH, auto_labels_key())
    # QC holds back every frame of two training logs and the first frames of all the others.
    held = labels["log_id"].isin(training_logs[:2]) | (
        labels["log_id"].isin(training_logs[2:]) & (labels["frame_index"] < 3)
    )
    labels.loc[held, "held_back"] = True
    # A third log as a real car records it: no ground-truth channel, so no lanes, no labels.
    real = training_logs[2]
    index = lake.get_parquet(MAIN_BRANCH, scene_index_key())
    index.loc[index["log_id"] == real, "lane_count"] = 0
    publish(
        lake,
        {auto_labels_key(): parquet_bytes(labels), scene_index_key(): parquet_bytes(index)},
        "label QC holds frames back; a log without ground truth",
    )

    result = dg.materialize([training_dataset], instance=instance, resources={"lake": lake})
    assert result.success
    pointer = lake.get_json(MAIN_BRANCH, TRAINING_LATEST)
    rows = lake.get_parquet(pointer["commit"], pointer["rows_key"])
    transfer = lake.get_parquet(pointer["commit"], pointer["transfer_rows_key"])
    manifest = lake.get_json(pointer["commit"], pointer["manifest_key"])

    def keys(table: pd.DataFrame) -> set[tuple[str, int]]:
        return set(zip(table["log_id"], table["frame_index"], strict=True))

    no_truth = keys(index[index["log_id"] == real])
    unlabelled = keys(labels[held]) | no_truth
    assert not keys(rows) & unlabelled  # never trained on with labels
    val_logs = set(rows.loc[rows["split"] == "val", "log_id"])
    expected = {key for key in unlabelled if key[0] not in val_logs}
    assert val_logs and len(expected) < len(unlabelled)  # some sit in val logs: left out
    assert real not in val_logs and no_truth <= expected
    assert keys(transfer) == expected
    reasons = transfer.groupby("reason").size().to_dict()
    assert reasons == {"label_qc": len(expected - no_truth), "no_ground_truth": len(no_truth)}
    assert manifest["transfer"]["frames"] == len(expected)
    assert manifest["transfer"]["by_reason"] == reasons
    assert set(manifest["transfer"]["logs"]) == {log for log, _ in expected}
    assert set(transfer["source_commit"]) <= set(manifest["source_commits"])  # retention keeps
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["transfer_frames"].value == len(expected)
    assert metadata["label_qc"].value["frames_without_ground_truth"] == len(no_truth)
    loaded = load_frames(lake, transfer, pointer["commit"])  # what trained_model reads
    assert len(loaded) == len(expected) and loaded["image"].map(len).gt(0).all()


def test_frames_without_ground_truth_are_never_benchmark_or_labelled_rows(local_lake, instance):
    publish_fleet(local_lake, fleet_table())
    index = local_lake.get_parquet(MAIN_BRANCH, scene_index_key())
    assert has_ground_truth(index).all()
    # Every log of the slices that have several: without the change the benchmark takes some.
    per_slice = index.groupby("slice")["log_id"].nunique()
    real = set(index.loc[index["slice"].isin(per_slice[per_slice > 1].index), "log_id"])
    index.loc[index["log_id"].isin(real), "lane_count"] = 0
    publish(local_lake, {scene_index_key(): parquet_bytes(index)}, "real cars' logs")

    frames = published_frames(local_lake)
    assert not set(frames["log_id"]) & real
    assert len(frames) == int((index["lane_count"] > 0).sum()) > 0
    result = dg.materialize([benchmark_set], instance=instance, resources={"lake": local_lake})
    assert result.success
    manifest = local_lake.get_json(MAIN_BRANCH, BENCHMARK_MANIFEST)
    assert not benchmark_log_ids(manifest) & real  # nothing to score a model against


def test_leaks_duplicates_and_corrupted_labels_fail_their_checks(fleet_lake, instance):
    lake = fleet_lake(fleet_table())
    benchmark_log, training_logs = roles(lake)
    fleet = fleet_table().set_index(["log_id", "frame_index"])
    source, other = training_logs[0], training_logs[1]
    # A training frame, slightly noised, copied into a benchmark log: a leak.
    rng = np.random.default_rng(0)
    shape = (*fleet.loc[(source, 5), ["image_height", "image_width"]], 3)
    frame = np.frombuffer(fleet.loc[(source, 5), "image"], np.uint8).reshape(shape)
    noised = np.clip(frame + rng.normal(0, 1.0, frame.shape), 0, 255).astype(np.uint8)
    replace_images(lake, benchmark_log, {0: noised.tobytes()})
    # Ten frames of one training log copied into another: near-duplicates across logs.
    replace_images(lake, other, {i: fleet.loc[(source, i), "image"] for i in range(10)})
    # A tenth of the frames' auto-labels inverted (a labeller swapping occupied and free).
    labels = lake.get_parquet(MAIN_BRANCH, auto_labels_key())
    wrong = np.random.default_rng(1).random(len(labels)) < 0.1
    labels.loc[wrong, "occupancy"] = labels.loc[wrong, "occupancy"].map(
        lambda cells: [1.0 - c for c in cells]
    )
    publish(lake, {auto_labels_key(): parquet_bytes(labels)}, "corrupt labels")
    inverted = set(zip(labels.loc[wrong, "log_id"], labels.loc[wrong, "frame_index"], strict=True))

    checks = check_dataset(lake, instance)

    leaks = checks["split_leaks"]
    assert not leaks.passed and leaks.severity == dg.AssetCheckSeverity.ERROR
    table = leaks.metadata["pairs_table"].value
    assert f"| {source} " in table and f"| {benchmark_log} " in table
    assert leaks.metadata["leaking_pairs"].value >= 1
    duplicates = checks["near_duplicates"]
    assert not duplicates.passed and duplicates.severity == dg.AssetCheckSeverity.WARN
    assert duplicates.metadata["pairs"].value >= 10
    assert f"| {other} " in duplicates.metadata["pairs_table"].value
    labels_check = checks["label_errors"]
    assert not labels_check.passed and labels_check.severity == dg.AssetCheckSeverity.WARN
    metadata = labels_check.metadata
    assert metadata["judged_cells"].value, "judged, and found wanting (not merely unjudged)"
    assert metadata["rate"].value > SETTINGS.max_label_error_rate  # measured: 0.083
    # The most suspicious frames are inverted ones (measured: 9 of the top 10).
    rows = metadata["ranked"].value.splitlines()[2:12]
    top = [(cells[1].strip(), int(cells[2])) for cells in (row.split("|") for row in rows)]
    assert sum(frame in inverted for frame in top) >= 8, top


def test_settings_reject_impossible_thresholds():
    config = yaml.safe_load((resources_dir() / "datasets.yaml").read_text())
    assert DataHealthSettings.load(config) == SETTINGS
    config["data_health"]["split_leaks"]["max_distance"] = 64
    with pytest.raises(SettingsError, match=r"split_leaks\.max_distance"):
        DataHealthSettings.load(config)
    config["data_health"]["split_leaks"]["max_distance"] = 3
    config["data_health"]["label_errors"]["folds"] = 1
    with pytest.raises(SettingsError, match="at least 2 folds"):
        DataHealthSettings.load(config)


def test_the_engine_that_embedded_most_frames_is_used_alone(local_lake):
    """Batches mined before a release carry the previous engine's vectors: never mixed."""
    keys = pd.DataFrame({"log_id": ["a", "a", "b", "c"], "frame_index": [0, 1, 0, 0]})
    old = embedding_table(keys.iloc[:1], np.ones((1, 3)), engine_sha="old" + "0" * 61)
    new = embedding_table(keys.iloc[1:3], np.arange(6).reshape(2, 3), engine_sha="new" + "0" * 61)
    publish(
        local_lake,
        {
            f"{FRAME_EMBEDDINGS_PREFIX}batch-1.parquet": parquet_bytes(old),
            f"{FRAME_EMBEDDINGS_PREFIX}batch-2.parquet": parquet_bytes(new),
        },
        "embeddings of two engines",
    )
    vectors, covered, engine = engine_embeddings(local_lake, keys, MAIN_BRANCH)
    assert engine.startswith("new") and covered.tolist() == [False, True, True, False]
    assert vectors.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert engine_embeddings(local_lake, keys.assign(log_id="z"), MAIN_BRANCH) is None
