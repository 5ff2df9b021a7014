"""Dataset manifests, version tags and the datasets.yaml settings."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from aiinfra_pipelines.datasets.manifest import build_manifest, next_dataset_version
from aiinfra_pipelines.datasets.settings import DatasetSettings
from aiinfra_pipelines.datasets.split import SplitLeakageError, split_by_log


def _dataset() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "log_id": ["a", "a", "a", "b", "b", "c", "d", "d"],
            "slice": ["day/clear/highway"] * 5 + ["night/fog/merge"] * 3,
            "split": ["train", "train", "train", "val", "val", "train", "val", "val"],
        }
    )


def test_manifest_counts_logs_and_provenance() -> None:
    label_qc = {"agreement_mean": 0.97, "held_back": 3}
    manifest = build_manifest(
        _dataset(), source_commits=["c0ffee", "beef01"], label_qc=label_qc, version="dataset-v0003"
    )
    assert manifest["version"] == "dataset-v0003"
    assert manifest["frames"] == 8
    assert manifest["frames_per_split"] == {"train": 4, "val": 4}
    assert manifest["counts"] == {
        "train": {"day/clear/highway": 3, "night/fog/merge": 1},
        "val": {"day/clear/highway": 2, "night/fog/merge": 2},
    }
    assert manifest["logs"] == {"train": ["a", "c"], "val": ["b", "d"]}
    assert manifest["log_counts"] == {"train": 2, "val": 2}
    assert manifest["slices"] == ["day/clear/highway", "night/fog/merge"]
    assert manifest["source_commits"] == ["c0ffee", "beef01"]
    assert manifest["label_qc"] == label_qc
    assert json.loads(json.dumps(manifest)) == manifest  # storable as JSON as is


def test_manifest_of_a_fleet_split_adds_up(fleet: pd.DataFrame) -> None:
    dataset = split_by_log(fleet, 0.2, 0)
    manifest = build_manifest(dataset, source_commits=["x"], label_qc={}, version="dataset-v0001")
    assert sum(manifest["frames_per_split"].values()) == len(fleet)
    for split, per_slice in manifest["counts"].items():
        assert per_slice == dataset.loc[dataset["split"] == split, "slice"].value_counts().to_dict()
    assert sum(manifest["log_counts"].values()) == fleet["log_id"].nunique()


def test_manifest_refuses_a_leaking_dataset() -> None:
    leaking = _dataset()
    leaking.loc[0, "split"] = "val"
    with pytest.raises(SplitLeakageError, match="a in"):
        build_manifest(leaking, source_commits=[], label_qc={}, version="dataset-v0001")


@pytest.mark.parametrize(
    ("tags", "expected"),
    [
        ([], "dataset-v0001"),
        (["dataset-v0001"], "dataset-v0002"),
        (["dataset-v0002", "dataset-v0009", "dataset-v0003"], "dataset-v0010"),
        (["release-v0005", "dataset-v0004-rc1", "dataset-vX", "benchmark-v0007"], "dataset-v0001"),
        (["dataset-v9999"], "dataset-v10000"),
    ],
)
def test_next_dataset_version(tags: list[str], expected: str) -> None:
    assert next_dataset_version(iter(tags)) == expected


def test_dataset_settings_from_resources() -> None:
    settings = DatasetSettings.load()
    assert isinstance(settings, DatasetSettings)
    assert 0 < settings.val_fraction < 1 and 0 <= settings.benchmark_fraction < 1
    assert settings.min_benchmark_logs_per_slice >= 1
    with pytest.raises(ValueError, match="val_fraction"):
        DatasetSettings.load(
            {
                "seed": 0,
                "split": {"val_fraction": 1.0},
                "benchmark": {"fraction": 0.2, "min_logs_per_slice": 1},
            }
        )
