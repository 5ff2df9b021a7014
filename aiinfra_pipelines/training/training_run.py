"""One training run of the perception model, from the latest dataset to a registry version.

What ``trained_model`` does, without Dagster around it: the dataset read at the commit its
pointer names, the environment's overrides and warm start applied, the model trained (resuming
from durable checkpoints) and registered with its lineage, so the output names the candidate.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from aiinfra_pipelines.config import PROJECT_ROOT
from aiinfra_pipelines.datasets.assets import TRAINING_LATEST
from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.perception.contract import perception_spec

from .identity import CandidateIdentity
from .resources import MlflowTracking
from .teacher import Teacher, teacher_overrides


def code_version() -> str:
    """The git commit of the code that trained a model (``unknown`` outside a checkout)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment_training_overrides() -> dict[str, Any]:
    """The environment's ``training:`` overrides of ``resources/training.yaml``.

    The same asset trains on a laptop CPU and on a multi-GPU node; what differs (accelerator,
    devices, strategy, precision) is environment configuration, not code. Unknown keys are
    refused by ``load_training_config`` like any other override.
    """
    from aiinfra_pipelines.environment import load_environment

    return dict(load_environment().get("training") or {})


@dataclass(frozen=True)
class TrainedModel:
    """A registered model: its candidate identity plus what the run learned and from where."""

    identity: CandidateIdentity
    dataset_rows_key: str
    epochs: int
    metrics: dict[str, float]
    warm_start_from: Any
    resumed_from_epoch: int | None
    distilled_from: str = "none"
    # Frames without labels the student learned from its teacher alone (the transfer set).
    transfer_frames: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The ``trained_model`` output as stored in the lake."""
        return {
            **self.identity.to_dict(),
            "dataset_rows_key": self.dataset_rows_key,
            "epochs": self.epochs,
            "metrics": self.metrics,
            "distilled_from": self.distilled_from,
            "transfer_frames": self.transfer_frames,
        }


def latest_training_frames(lake: VersionedLake) -> tuple[dict[str, Any], pd.DataFrame]:
    """The newest training dataset's pointer and its frames, read at the pointer's commit."""
    pointer = lake.get_json_or_none(MAIN_BRANCH, TRAINING_LATEST)
    if pointer is None:
        raise ValueError("no training dataset on main: materialize training_dataset first")
    rows = lake.get_parquet(pointer["commit"], pointer["rows_key"])
    return pointer, load_frames(lake, rows, pointer["commit"])


def transfer_frames(
    lake: VersionedLake, pointer: dict[str, Any], log: Callable[[str], None]
) -> pd.DataFrame | None:
    """The dataset version's transfer set (frames without usable labels), ``None`` without one.

    A real car's camera need not be the contract's: its frames cannot be read by the network,
    so they are left out (and counted in the log) rather than failing the training.
    """
    key = pointer.get("transfer_rows_key")
    if not key:
        return None
    frames = load_frames(lake, lake.get_parquet(pointer["commit"], key), pointer["commit"])
    spec = perception_spec()
    fits = (frames["image_height"] == spec.image_height) & (
        frames["image_width"] == spec.image_width
    )
    if not fits.all():
        log(
            f"{int((~fits).sum())} of {len(frames)} transfer frames left out: their camera is "
            f"not the contract's {spec.image_height}x{spec.image_width}"
        )
    return frames[fits].reset_index(drop=True)


def train_and_register(
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    dagster_run_id: str,
    log: Callable[[str], None],
    teacher: Teacher | None = None,
) -> TrainedModel:
    """Train the car's network on the newest training dataset on ``main`` and register it.

    ``teacher`` (the cycle's cloud teacher) is distilled from when ``training.yaml``
    ``distillation.enabled``.
    """
    from .warm_start import reference_warm_start

    overrides = environment_training_overrides()
    return _train_registered(
        lake,
        mlflow_tracking,
        dagster_run_id,
        log,
        overrides=overrides,
        warm_start=lambda: reference_warm_start(lake, mlflow_tracking.uri(), overrides),
        checkpoint_subdir="",
        teacher=teacher,
    )


def train_teacher_and_register(
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    dagster_run_id: str,
    log: Callable[[str], None],
) -> TrainedModel:
    """Train the cloud teacher (``training.yaml`` ``teacher``) on the same newest dataset.

    It grows from the previous teacher (the newest registered version of its model) as the
    student grows from the release, and checkpoints under ``teacher/`` so its resume point
    never mixes with the student's.
    """
    from .warm_start import latest_registered_warm_start

    overrides = teacher_overrides(environment_training_overrides())
    name = str(overrides["mlflow"]["registered_model"])
    return _train_registered(
        lake,
        mlflow_tracking,
        dagster_run_id,
        log,
        overrides=overrides,
        warm_start=lambda: latest_registered_warm_start(
            mlflow_tracking.uri(), name, "previous teacher"
        ),
        checkpoint_subdir="teacher",
        teacher=None,
    )


def _train_registered(
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    dagster_run_id: str,
    log: Callable[[str], None],
    *,
    overrides: dict[str, Any],
    warm_start: Callable[[], Any],
    checkpoint_subdir: str,
    teacher: Teacher | None,
) -> TrainedModel:
    """One tracked, resumable training on the newest dataset, registered with its lineage."""
    # Imported here: Lightning and MLflow cost seconds, and every run process loads this module.
    from .tracking import register_model_version
    from .train import train_perception_model

    pointer, frames = latest_training_frames(lake)
    # Only a student with a teacher can learn frames without labels; the teacher itself never.
    transfer = transfer_frames(lake, pointer, log) if teacher is not None else None
    lineage = {
        "dataset_version": pointer["version"],
        "dataset_commit": pointer["commit"],
        "code_version": code_version(),
        "dagster_run_id": dagster_run_id,
    }
    checkpoints = mlflow_tracking.checkpoints()
    if checkpoint_subdir:
        checkpoints = checkpoints / checkpoint_subdir
    result = train_perception_model(
        frames[frames["split"] == "train"],
        frames[frames["split"] == "val"],
        checkpoint_dir=checkpoints / pointer["version"],
        mlflow_tracking_uri=mlflow_tracking.uri(),
        experiment=mlflow_tracking.experiment,
        run_tags={"dagster_run_id": dagster_run_id, "dataset_version": pointer["version"]},
        params=lineage,
        config=overrides,
        warm_start=warm_start(),
        teacher=teacher,
        transfer_frames=transfer,
    )
    log(
        f"trained from {result.warm_start_from}; distilled from {result.distilled_from}"
        f" ({result.transfer_frames} transfer frames)"
    )
    registered = register_model_version(
        mlflow_tracking.uri(),
        result.model_uri,
        result.mlflow_run_id,
        tags={
            **lineage,
            "mlflow_run_id": result.mlflow_run_id,
            "distilled_from": result.distilled_from,
        },
        config=overrides,
    )
    identity = CandidateIdentity(
        model_version=registered.version,
        registered_model=registered.registered_model,
        mlflow_run_id=result.mlflow_run_id,
        model_uri=result.model_uri,
        dataset_version=pointer["version"],
        dataset_commit=pointer["commit"],
        code_version=lineage["code_version"],
    )
    return TrainedModel(
        identity=identity,
        dataset_rows_key=pointer["rows_key"],
        epochs=result.epochs_completed,
        metrics={name: round(float(value), 4) for name, value in result.metrics.items()},
        warm_start_from=result.warm_start_from,
        resumed_from_epoch=result.resumed_from_epoch,
        distilled_from=result.distilled_from,
        transfer_frames=result.transfer_frames,
    )
