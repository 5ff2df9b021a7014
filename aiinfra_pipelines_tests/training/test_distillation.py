"""Distillation from the cloud teacher: the loss, the frozen teacher outside the student's
state, the lineage a distilled run records, and the Dagster assets that train both."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient

from aiinfra_pipelines.lake.io_manager import LakeIOManager
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.perception.contract import decode_images, images_to_input, perception_spec
from aiinfra_pipelines.training.checkpointing import RUN_ID_FILE
from aiinfra_pipelines.training.definitions import defs as training_defs
from aiinfra_pipelines.training.module import PerceptionModule
from aiinfra_pipelines.training.objective import distillation_loss
from aiinfra_pipelines.training.resources import MlflowTracking
from aiinfra_pipelines.training.settings import load_training_config
from aiinfra_pipelines.training.teacher import Teacher, teacher_overrides
from aiinfra_pipelines_tests.support.config_copies import resources_with
from aiinfra_pipelines_tests.support.published_dataset import publish_training_dataset

from .conftest import SMALL_CONFIG, tracking_uri, train_small

DISTILLED = {**SMALL_CONFIG, "distillation": {"enabled": True, "weight": 0.5}}


def _logits(*values: float) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float32)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_distillation_loss_is_least_where_the_student_reads_as_the_teacher(temperature):
    teacher_logits, teacher_gap = _logits(2.0, -1.0, 0.5), torch.tensor([[0.4]])
    student = _logits(2.0, -1.0, 0.5).requires_grad_(True)
    student_gap = torch.tensor([[0.4]], requires_grad=True)
    agreeing = distillation_loss(
        student,
        student_gap,
        teacher_logits,
        teacher_gap,
        temperature=temperature,
        lead_gap_weight=1.0,
        smooth_l1_beta=0.05,
    )
    agreeing.backward()
    assert student.grad.abs().max() < 1e-6 and student_gap.grad.abs().max() < 1e-6

    disagreeing = distillation_loss(
        _logits(-2.0, 1.0, 0.5),
        torch.tensor([[0.9]]),
        teacher_logits,
        teacher_gap,
        temperature=temperature,
        lead_gap_weight=1.0,
        smooth_l1_beta=0.05,
    )
    assert disagreeing > agreeing + 0.5


def test_a_temperature_at_or_below_zero_is_refused():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        distillation_loss(
            _logits(1.0),
            torch.zeros(1, 1),
            _logits(1.0),
            torch.zeros(1, 1),
            temperature=0.0,
            lead_gap_weight=1.0,
            smooth_l1_beta=0.05,
        )


def _module(config: dict, seed: int = 0) -> PerceptionModule:
    return PerceptionModule.from_config(perception_spec(), load_training_config(config), seed)


def test_the_teacher_is_frozen_and_outside_the_students_weights_and_optimizer():
    student = _module(SMALL_CONFIG)
    teacher = _module(teacher_overrides(SMALL_CONFIG), seed=1).net
    own_keys = set(student.state_dict())
    student.attach_teacher(teacher, weight=0.5, temperature=2.0)

    assert set(student.state_dict()) == own_keys  # a checkpoint stays the car's size
    optimized = {id(p) for p in student.parameters()}
    assert not any(id(p) in optimized for p in teacher.parameters())
    assert not any(p.requires_grad for p in teacher.parameters())
    assert not teacher.training
    with pytest.raises(ValueError, match="weight must be within"):
        student.attach_teacher(teacher, weight=0.0, temperature=2.0)


def test_a_distilled_run_records_its_teacher_and_leaves_it_out_of_the_checkpoint(
    small_split, uninterrupted, tmp_path
):
    train, val = small_split
    teacher = Teacher(uninterrupted.network, "models:/perception-teacher/7 (teacher version 7)")
    result = train_small(
        train, val, tmp_path, config=DISTILLED, max_epochs=1, seed=0, teacher=teacher
    )

    assert result.distilled_from == teacher.source
    client = MlflowClient(tracking_uri=tracking_uri(tmp_path))
    params = client.get_run(result.mlflow_run_id).data.params
    assert params["distilled_from"] == teacher.source
    assert params["distillation.weight"] == "0.5"
    checkpoint = torch.load(result.checkpoint_path, map_location="cpu", weights_only=False)
    assert set(checkpoint["state_dict"]) == set(
        f"net.{key}" for key in uninterrupted.network.state_dict()
    )
    assert (tmp_path / "checkpoints" / RUN_ID_FILE).read_text() == result.mlflow_run_id


def test_with_distillation_disabled_the_teacher_is_ignored(small_split, uninterrupted, tmp_path):
    train, val = small_split
    teacher = Teacher(uninterrupted.network, "models:/perception-teacher/1")
    disabled = {**SMALL_CONFIG, "distillation": {"enabled": False}}
    result = train_small(
        train, val, tmp_path, config=disabled, max_epochs=1, seed=0, teacher=teacher
    )
    plain = train_small(train, val, tmp_path / "plain", config=disabled, max_epochs=1, seed=0)

    assert result.distilled_from == "none"
    for key, value in result.network.state_dict().items():  # same seed, same data: same model
        assert torch.equal(value, plain.network.state_dict()[key]), key


def test_a_student_taught_by_the_teacher_alone_reads_frames_as_the_teacher_does(
    small_split, tmp_path
):
    """weight 1: the labels play no part; the student fits the teacher's readings.

    The teacher here is an untrained network, whose readings have nothing to do with the
    labels, so the two losses pull apart: against the same recipe on the labels (same seed and
    epochs) the taught student's occupancy probabilities sit far closer to the teacher's.
    """
    train, val = small_split
    untrained = _module(SMALL_CONFIG, seed=5).net.eval()
    teacher = Teacher(untrained, "models:/perception-teacher/1")
    only_teacher = {**SMALL_CONFIG, "distillation": {"enabled": True, "weight": 1.0}}
    taught = train_small(
        train, val, tmp_path / "taught", config=only_teacher, max_epochs=4, seed=3, teacher=teacher
    )
    labelled = train_small(
        train, val, tmp_path / "labels", config=SMALL_CONFIG, max_epochs=4, seed=3
    )

    spec = perception_spec()
    images = torch.from_numpy(
        images_to_input(decode_images(train["image"].tolist(), spec.image_height, spec.image_width))
    )
    with torch.no_grad():
        reference = torch.sigmoid(untrained(images)[0])
        distance = {
            name: (torch.sigmoid(result.network.eval()(images)[0]) - reference).abs().mean().item()
            for name, result in (("taught", taught), ("labelled", labelled))
        }
    assert distance["taught"] < 0.5 * distance["labelled"], distance


# -- the assets -------------------------------------------------------------------------------

VERSION = "dataset-v0001"


def _unsplit_frames(small_split, fleet: pd.DataFrame) -> pd.DataFrame:
    """A few frames of the fleet's logs that neither split of ``small_split`` holds, the last
    one from a camera that is not the contract's (a real car's: left out, not fatal)."""
    train, val = small_split
    used = set(train["log_id"]) | set(val["log_id"])
    frames = fleet[~fleet["log_id"].isin(used)].head(40).reset_index(drop=True)
    last = frames.index[-1]
    frames.loc[last, ["image_height", "image_width"]] = (48, 128)
    frames.at[last, "image"] = bytes(48 * 128 * 3)
    return frames


def _materialize_training(
    small_split, tmp_path, training_yaml: dict, transfer: pd.DataFrame | None = None
) -> dict:
    train, val = small_split
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    publish_training_dataset(
        lake,
        pd.concat([train.assign(split="train"), val.assign(split="val")], ignore_index=True),
        VERSION,
        transfer=transfer,
    )
    uri = tracking_uri(tmp_path)
    (tmp_path / "home").mkdir()
    resources = {
        "lake": lake,
        "io_manager": LakeIOManager(lake=lake),
        "mlflow_tracking": MlflowTracking(
            tracking_uri=uri, checkpoint_root=str(tmp_path / "checkpoints")
        ),
    }
    with (
        resources_with(tmp_path / "resources", {"training.yaml": training_yaml}),
        dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance,
    ):
        result = dg.materialize(list(training_defs.assets), resources=resources, instance=instance)
    assert result.success
    return {
        "teacher": result.output_for_node("teacher_model"),
        "student": result.output_for_node("trained_model"),
        "client": MlflowClient(tracking_uri=uri, registry_uri=uri),
        "tmp_path": tmp_path,
    }


def test_the_training_group_trains_a_registered_teacher_and_a_student_distilled_from_it(
    small_split, fleet, tmp_path
):
    tiny = {
        **SMALL_CONFIG,
        "max_epochs": 1,
        "distillation": {"enabled": True},
        "teacher": {"max_epochs": 1, "model": {"width": 24, "hidden": 128}},
    }
    # Frames of logs in neither split, published as the dataset's transfer set (what
    # training_dataset does with frames label QC held back).
    transfer = _unsplit_frames(small_split, fleet)
    trained = _materialize_training(small_split, tmp_path, tiny, transfer)
    teacher, student, client = trained["teacher"], trained["student"], trained["client"]
    student_run = client.get_run(student["mlflow_run_id"]).data.params
    assert student["transfer_frames"] == len(transfer) - 1 > 0  # the odd camera's frame left out
    assert student_run["transfer_frames"] == str(len(transfer) - 1)

    assert teacher["trained"] and teacher["registered_model"] == "perception-teacher"
    assert teacher["dataset_version"] == student["dataset_version"] == VERSION
    assert student["registered_model"] == "perception"
    assert student["distilled_from"].startswith(teacher["model_uri"])
    version = client.get_model_version("perception", student["model_version"])
    assert version.tags["distilled_from"] == student["distilled_from"]
    teacher_run = client.get_run(teacher["mlflow_run_id"]).data.params
    assert teacher_run["model.width"] == "24" and teacher_run["distillation.enabled"] == "False"
    assert teacher_run["transfer_frames"] == "0"  # the teacher learns from labels only
    # The teacher's resume point is its own: never the student's checkpoint directory.
    assert (tmp_path / "checkpoints" / "teacher" / VERSION / "last.ckpt").exists()
    assert (tmp_path / "checkpoints" / VERSION / "last.ckpt").exists()


def test_with_distillation_disabled_no_teacher_trains_and_the_student_learns_from_labels(
    small_split, fleet, tmp_path
):
    trained = _materialize_training(
        small_split,
        tmp_path,
        {**SMALL_CONFIG, "max_epochs": 1, "distillation": {"enabled": False}},
        transfer=_unsplit_frames(small_split, fleet),
    )
    assert trained["teacher"] == {"trained": False}
    assert trained["student"]["distilled_from"] == "none"
    assert trained["student"]["transfer_frames"] == 0  # no teacher: frames without labels wait
    assert trained["client"].search_model_versions("name = 'perception-teacher'") == []
