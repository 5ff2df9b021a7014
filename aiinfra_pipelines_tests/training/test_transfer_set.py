"""Distillation on a transfer set: frames without labels, learned from the teacher alone.

Where every frame is labelled the teacher has little to add (docs/training.md: four regimes
measured, none paying); where a label budget leaves most frames unlabelled, the teacher's
readings of those frames are what the student lacks. These tests hold the training surface to
that (``train_perception_model(transfer_frames=...)``) and its refusals.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient

from aiinfra_pipelines.datasets.benchmark import benchmark_log_ids, freeze_benchmark
from aiinfra_pipelines.evaluation.predict import slice_metrics
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.training.datamodule import (
    IMAGE_COLUMNS,
    PerceptionDataModule,
    labelled_rows,
)
from aiinfra_pipelines.training.module import PerceptionModule
from aiinfra_pipelines.training.settings import load_training_config
from aiinfra_pipelines.training.teacher import Teacher, teacher_overrides
from aiinfra_pipelines.training.trainer import scratch_trainer
from aiinfra_pipelines_tests.support.fleet_data import fleet_frames

from .conftest import SMALL_CONFIG, tracking_uri, train_small

DISTILLED = {**SMALL_CONFIG, "distillation": {"enabled": True, "weight": 0.5}}
# The tolerance: the distilled student must read the benchmark's worst slice at least this much
# (occupancy accuracy) better than the plain one. This seed measures +0.058 (0.8049 -> 0.8631;
# teacher 0.8496), seeds 1 and 2 of the benchmark +0.022 and +0.142 (docs/training.md). The run
# is seeded and deterministic; a sixth of the effect leaves room for float differences between
# CPUs, and a change that loses the effect still fails.
WORST_SLICE_GAIN = 0.01
MIN_SLICE_FRAMES = 10
LABELLED_SHARE = 0.33
TEACHER_EPOCHS, STUDENT_EPOCHS = 18, 10


def _budgeted(fleet: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """A frozen benchmark, and the rest split by log: a third labelled, the rest not."""
    manifest = freeze_benchmark(None, fleet, fraction=0.25, seed=0, min_logs_per_slice=1)
    held = fleet["log_id"].isin(benchmark_log_ids(manifest))
    rest = fleet[~held]
    logs = np.array(sorted(rest["log_id"].unique()))
    np.random.default_rng(0).shuffle(logs)
    labelled = rest["log_id"].isin(set(logs[: max(1, round(len(logs) * LABELLED_SHARE))]))
    return {
        "benchmark": fleet[held].reset_index(drop=True),
        "labelled": rest[labelled].reset_index(drop=True),
        # Only what a camera log without ground truth carries: the labels are gone.
        "unlabelled": rest.loc[~labelled, ["log_id", *IMAGE_COLUMNS]].reset_index(drop=True),
    }


def _worst_slice(network: torch.nn.Module, frames: pd.DataFrame) -> float:
    metrics = slice_metrics(network.eval(), frames)
    slices = metrics[(metrics["kind"] == "slice") & (metrics["frames"] >= MIN_SLICE_FRAMES)]
    return float(slices["occupancy_accuracy"].min())


@pytest.fixture(scope="module")
def budget_fleet() -> dict[str, pd.DataFrame]:
    """The distillation benchmark's seed-0 fleet (64 drives, ~3,300 frames), budgeted."""
    return _budgeted(fleet_frames(8, 8, 0))


@pytest.mark.slow  # drives a 64-log fleet and trains three networks (~3 min on 2 cores)
def test_the_student_distilled_on_unlabelled_frames_beats_the_plain_one_on_the_worst_slice(
    budget_fleet, tmp_path
):
    """Test 3 of issue 13, as ``benchmarks/distillation.py --labelled-share 0.33`` runs it.

    The project's recipe (training.yaml), teacher and plain student on the labelled third, the
    distilled student on it plus the other two thirds without labels; scored per slice on the
    frozen benchmark.
    """
    data = budget_fleet
    benchmark = data["benchmark"]
    teacher_run = train_small(
        data["labelled"],
        benchmark,
        tmp_path / "teacher",
        config=teacher_overrides({}),
        max_epochs=TEACHER_EPOCHS,
        seed=0,
    )
    teacher = Teacher(teacher_run.network, "models:/perception-teacher/1")
    plain = train_small(
        data["labelled"], benchmark, tmp_path / "plain", config={}, max_epochs=STUDENT_EPOCHS
    )
    distilled = train_small(
        data["labelled"],
        benchmark,
        tmp_path / "distilled",
        config={"distillation": {"enabled": True}},
        max_epochs=STUDENT_EPOCHS,
        teacher=teacher,
        transfer_frames=data["unlabelled"],
    )

    worst = {
        name: _worst_slice(run.network, benchmark)
        for name, run in (("teacher", teacher_run), ("plain", plain), ("distilled", distilled))
    }
    assert worst["distilled"] >= worst["plain"] + WORST_SLICE_GAIN, worst
    params = (
        MlflowClient(tracking_uri(tmp_path / "distilled"))
        .get_run(distilled.mlflow_run_id)
        .data.params
    )
    assert params["transfer_frames"] == str(len(data["unlabelled"]))
    assert params["train_frames"] == str(len(data["labelled"]))
    assert params["distilled_from"] == teacher.source


def test_transfer_frames_join_training_without_labels_and_validation_stays_labelled(fleet):
    data = _budgeted(fleet)
    config = load_training_config(SMALL_CONFIG)
    datamodule = PerceptionDataModule.from_config(
        data["labelled"], data["benchmark"], config, seed=0, transfer_frames=data["unlabelled"]
    )
    train_set = datamodule.train_dataset
    assert train_set.transfer_count == len(data["unlabelled"])
    assert len(train_set) == len(data["labelled"]) + len(data["unlabelled"])
    labelled = labelled_rows(train_set.lead_gap)
    assert labelled[: len(data["labelled"])].all() and not labelled[len(data["labelled"]) :].any()
    assert labelled_rows(datamodule.val_dataset.lead_gap).all()
    spec = perception_spec()
    first = np.frombuffer(data["unlabelled"]["image"].iloc[0], np.uint8)
    stored = train_set.images[len(data["labelled"])].permute(1, 2, 0).reshape(-1).numpy()
    assert np.array_equal(stored, first)  # the transfer frame's own pixels, decoded once
    assert stored.size == spec.image_height * spec.image_width * 3


def test_a_truncated_transfer_frame_is_refused_naming_the_transfer_set(fleet):
    data = _budgeted(fleet)
    broken = data["unlabelled"].copy()
    broken.loc[0, "image"] = broken.loc[0, "image"][:-7]
    with pytest.raises(ValueError, match=r"transfer set.*1 image payloads are not"):
        PerceptionDataModule.from_config(
            data["labelled"],
            data["benchmark"],
            load_training_config(SMALL_CONFIG),
            seed=0,
            transfer_frames=broken,
        )


def test_balancing_by_labels_is_refused_with_a_transfer_set(fleet):
    data = _budgeted(fleet)
    config = load_training_config({**SMALL_CONFIG, "data": {"ego_lane_balance": 0.5}})
    with pytest.raises(ValueError, match="ego_lane_balance"):
        PerceptionDataModule.from_config(
            data["labelled"], data["benchmark"], config, seed=0, transfer_frames=data["unlabelled"]
        )


def test_transfer_frames_without_a_teacher_or_from_a_validation_log_are_refused(
    fleet, uninterrupted, tmp_path
):
    data = _budgeted(fleet)
    with pytest.raises(ValueError, match="need a teacher"):
        train_small(
            data["labelled"],
            data["benchmark"],
            tmp_path / "no-teacher",
            config=DISTILLED,
            max_epochs=1,
            transfer_frames=data["unlabelled"],
        )
    leaking = pd.concat([data["unlabelled"], data["benchmark"][["log_id", *IMAGE_COLUMNS]]])
    with pytest.raises(ValueError, match="transfer and val frames share"):
        train_small(
            data["labelled"],
            data["benchmark"],
            tmp_path / "leak",
            config=DISTILLED,
            max_epochs=1,
            teacher=Teacher(uninterrupted.network, "models:/perception-teacher/1"),
            transfer_frames=leaking,
        )
    assert not (tmp_path / "no-teacher" / "checkpoints").exists()  # refused before any run


def test_a_fit_with_a_transfer_set_and_no_teacher_attached_is_refused(fleet):
    data = _budgeted(fleet)
    config = load_training_config(SMALL_CONFIG)
    datamodule = PerceptionDataModule.from_config(
        data["labelled"], data["benchmark"], config, seed=0, transfer_frames=data["unlabelled"]
    )
    module = PerceptionModule.from_config(perception_spec(), config, 0)
    with pytest.raises(ValueError, match="no teacher is attached"):
        scratch_trainer(config, max_epochs=1).fit(module, datamodule=datamodule)
