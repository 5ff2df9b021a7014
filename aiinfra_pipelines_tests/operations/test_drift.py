"""Drift: image statistics and confidence of recent frames against the training dataset."""

from __future__ import annotations

import dataclasses

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.datasets.selection import REFERENCE_COLUMNS, TRAINING_LATEST
from aiinfra_pipelines.fleet.degradation import degrade
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.io_manager import parquet_bytes
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.operations.assets import drift_monitor, fleet_telemetry, telemetry_batches
from aiinfra_pipelines.operations.drift import (
    DriftSettings,
    drift_record_key,
    drift_verdict,
    image_statistics,
    latest_drift_verdict,
)
from aiinfra_pipelines.operations.landing import land_telemetry
from aiinfra_pipelines.perception.deployed import load_deployed_engine
from aiinfra_pipelines_tests.support.operations_lake import (
    as_bytes,
    fleet_vins,
    materialized,
    publish,
    publish_logs,
    release_resources,
    synthetic_logs,
    telemetry_records,
)

SETTINGS = DriftSettings.load()
OLD = "2024-05-01T08:00:00+00:00"


def night(logs, seed=0):
    """The same drives at night: the fleet's own night degradation on every frame."""
    rng = np.random.default_rng(seed)
    return [
        dataclasses.replace(
            log,
            frames=[
                dataclasses.replace(frame, image=degrade(frame.image, "clear", "night", rng))
                for frame in log.frames
            ],
            metadata={**log.metadata, "lighting": "night"},
        )
        for log in logs
    ]


def signals(logs) -> pd.DataFrame:
    images = np.stack([frame.image for log in logs for frame in log.frames])
    return image_statistics(images)


def test_image_statistics_see_darkness_and_fog():
    logs = synthetic_logs(2, frames=10)
    day, dark = signals(logs), signals(night(logs))
    assert (dark["brightness"] < day["brightness"] * 0.6).all()
    rng = np.random.default_rng(0)
    fog = np.stack([degrade(f.image, "fog", "day", rng) for f in logs[0].frames])
    assert (image_statistics(fog)["contrast"] < day["contrast"].iloc[:10]).all()
    with pytest.raises(ValueError, match="N x H x W x 3"):
        image_statistics(np.zeros((2, 4, 4)))


def test_the_same_distribution_is_stable_and_a_shifted_one_drifts():
    reference = signals(synthetic_logs(10, frames=20))
    reference["confidence"] = np.random.default_rng(0).uniform(0.7, 1.0, len(reference))
    same = signals(synthetic_logs(10, frames=20, first_seed=50))
    same["confidence"] = np.random.default_rng(1).uniform(0.7, 1.0, len(same))
    stable = drift_verdict(reference, same, SETTINGS, identity={"case": "same"})
    assert not stable["drifted"] and not stable["insufficient"], stable["metrics"]
    shifted = signals(night(synthetic_logs(10, frames=20, first_seed=50)))
    shifted["confidence"] = np.random.default_rng(1).uniform(0.2, 0.6, len(shifted))
    drifted = drift_verdict(reference, shifted, SETTINGS, identity={"case": "night"})
    assert drifted["drifted"]
    assert {"brightness", "confidence"} <= set(drifted["signals"])
    assert drifted["metrics"]["brightness"]["psi"] > SETTINGS.psi_threshold
    assert drifted["id"] != stable["id"]
    assert (
        drifted["id"]
        == drift_verdict(reference, shifted, SETTINGS, identity={"case": "night"})["id"]
    )


def test_too_few_frames_give_no_verdict():
    few = signals(synthetic_logs(2, frames=50))
    verdict = drift_verdict(few, few, SETTINGS, identity={})
    assert verdict["insufficient"] and not verdict["drifted"]
    assert "at least" in verdict["reason"]


def publish_training_dataset(lake, logs) -> None:
    """The reference: a training dataset (rows referencing published frames) and its pointer."""
    index = scene_index_view(lake)
    rows = index[index["log_id"].isin({log.log_id for log in logs})][REFERENCE_COLUMNS]
    key = "datasets/training/dataset-v0001/dataset.parquet"
    commit = publish(
        lake, {key: parquet_bytes(rows.assign(badcase=False, split="train"))}, "dataset"
    )
    publish(
        lake,
        {
            TRAINING_LATEST: as_bytes(
                {"version": "dataset-v0001", "commit": commit, "rows_key": key, "manifest_key": ""}
            )
        },
        "pointer",
    )


@pytest.fixture
def world(tmp_path):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    reference = synthetic_logs(5, frames=40, recorded_at=OLD)
    publish_logs(lake, reference, batch="old")
    publish_training_dataset(lake, reference)
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        yield lake, instance, release_resources(lake, tmp_path, f"sqlite:///{tmp_path}/m.db")


def run_drift(instance, resources) -> dg.ExecuteInProcessResult:
    return dg.materialize([drift_monitor], instance=instance, resources=resources)


def check_passed(result) -> bool:
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation.passed


def test_drift_monitor_publishes_a_stable_verdict_for_familiar_data(world):
    lake, instance, resources = world
    publish_logs(lake, synthetic_logs(5, frames=40, first_seed=40), batch="new")
    result = run_drift(instance, resources)
    meta = materialized(result, "drift_monitor")
    assert meta["drifted"] is False and check_passed(result)
    verdict = latest_drift_verdict(lake)
    assert verdict["id"] == meta["verdict_id"] and verdict["recent_frames"] == 200
    assert verdict["identity"]["dataset_version"] == "dataset-v0001"
    assert lake.object_exists(MAIN_BRANCH, drift_record_key(verdict["id"]))
    again = materialized(run_drift(instance, resources), "drift_monitor")
    assert again["verdict_id"] == meta["verdict_id"]  # same situation, same id


def test_drift_monitor_flags_night_frames_and_telemetry_confidence(world):
    lake, instance, resources = world
    publish_logs(lake, night(synthetic_logs(5, frames=40, first_seed=40)), batch="new")
    deployed = load_deployed_engine(lake)
    land_telemetry(
        lake,
        "t1",
        telemetry_records(deployed.engine.sha256, fleet_vins(3), frames=100, confidence=0.97),
    )
    instance.add_dynamic_partitions(telemetry_batches.name, ["ingest-t1"])
    dg.materialize(
        [fleet_telemetry], instance=instance, resources=resources, partition_key="ingest-t1"
    )
    result = run_drift(instance, resources)
    meta = materialized(result, "drift_monitor")
    assert meta["drifted"] is True and not check_passed(result)
    verdict = latest_drift_verdict(lake)
    assert "brightness" in verdict["signals"]
    # model zero is near-zero confident on the reference; the fleet reports 0.97
    assert verdict["metrics"]["telemetry_confidence"]["drifted"]
    assert verdict["identity"]["telemetry_commit"]


def test_without_a_training_dataset_there_is_no_verdict_yet(tmp_path):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    publish_logs(lake, synthetic_logs(2, frames=10))
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        result = run_drift(instance, release_resources(lake, tmp_path, "sqlite:///x.db"))
    verdict = latest_drift_verdict(lake)
    assert verdict["insufficient"] and not verdict["drifted"] and check_passed(result)
