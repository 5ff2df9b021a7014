"""``train_perception_model``: the plain function behind the ``trained_model`` asset.

One call = one MLflow run = one checkpoint directory. The function is restartable: every epoch
ends with a checkpoint written durably (temporary file, fsync, rename) to ``checkpoint_dir``;
when the process is killed and the function is called again with the same directory, it
resumes from ``last.ckpt`` (the epoch count continues) and keeps logging into the same MLflow
run, whose id is stored next to the checkpoints (``mlflow_run_id``). A resumed run follows the
same data order, augmentation draws and learning-rate curve as an uninterrupted one, so it
also ends with the same weights.

Only global rank 0 talks to MLflow and writes into ``checkpoint_dir``; the same code runs on
a CPU laptop, one GPU, or several under DDP (``resources/training.yaml`` trainer section).

The parts live in modules of their own: :mod:`.settings` (the recipe), :mod:`.checkpointing`,
:mod:`.tracking` (MLflow), :mod:`.trainer` (the Lightning Trainer) and :mod:`.evaluation`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import pandas as pd
from lightning.pytorch.utilities import rank_zero_only

from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.network import PerceptionNet

from .checkpoint_tiers import CheckpointRetention
from .checkpointing import (
    completed_epochs,
    exclusive,
    resume_point,
)
from .datamodule import PerceptionDataModule
from .evaluation import evaluate_network
from .module import PerceptionModule
from .resources import mlflow_tracking_uri as tracking_uri_scope
from .settings import flatten_params, load_training_config
from .teacher import Teacher
from .tracking import (
    MlflowEpochLogger,
    TrackedRun,
    record_outcome,
    tracked_run,
)
from .trainer import build_trainer, fit, preserved_torch_determinism
from .warm_start import WarmStart, fits, warm_start_settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingResult:
    """What a finished (or resumed-and-finished) training hands to the asset.

    ``resumed_from_epoch`` is the number of epochs already completed in the checkpoint this
    call resumed from (training continued with that 0-based epoch), or ``None`` for a fresh
    start. ``metrics`` are the final network's val metrics (``val_loss``,
    ``val_occupancy_accuracy``, ``val_occupancy_f1``, ``val_lead_gap_mae_m``).
    """

    network: PerceptionNet
    mlflow_run_id: str
    epochs_completed: int
    resumed_from_epoch: int | None
    metrics: dict[str, float]
    checkpoint_path: Path
    model_uri: str
    experiment_id: str
    # What the weights started from (a WarmStart's source), "none" for a cold start.
    warm_start_from: str = "none"
    # The teacher the student was distilled from (a Teacher's source), "none" without one.
    distilled_from: str = "none"
    # Frames without labels learned from the teacher alone (``transfer_frames``).
    transfer_frames: int = 0


def _frames_fingerprint(
    frames: pd.DataFrame,
    columns: tuple[str, ...] = ("image", "ground_truth", "lane_index", "lane_count"),
) -> str:
    """SHA-256 over what training reads from each frame: a resume on other data is refused."""
    digest = hashlib.sha256()
    for column in columns:
        for value in frames[column]:
            digest.update(value if isinstance(value, bytes) else str(value).encode())
            digest.update(b"\x00")
    return digest.hexdigest()


def _check_split(
    train_frames: pd.DataFrame, val_frames: pd.DataFrame, trained_on: str = "train"
) -> None:
    """A log in both splits leaks near-identical consecutive frames into validation."""
    if "log_id" not in train_frames or "log_id" not in val_frames:
        return
    shared = sorted(set(train_frames["log_id"]) & set(val_frames["log_id"]))
    if shared:
        more = f" and {len(shared) - 3} more" if len(shared) > 3 else ""
        raise ValueError(
            f"{trained_on} and val frames share {len(shared)} log(s) "
            f"({', '.join(shared[:3])}{more}); split by log so validation measures "
            "generalization, not memory"
        )


def _check_transfer(
    transfer_frames: pd.DataFrame | None, val_frames: pd.DataFrame, teacher: Teacher | None
) -> pd.DataFrame | None:
    """The transfer set to train on (``None``: none), refused where it cannot be used."""
    if transfer_frames is None or len(transfer_frames) == 0:
        return None
    if teacher is None:
        raise ValueError(
            f"{len(transfer_frames)} transfer frames (no labels) need a teacher to learn from: "
            "pass teacher= and enable training.yaml distillation"
        )
    _check_split(transfer_frames, val_frames, trained_on="transfer")
    return transfer_frames


def _resolve_settings(
    config: Mapping[str, Any] | None,
    max_epochs: int | None,
    seed: int | None,
    warm_start: WarmStart | None,
) -> tuple[dict[str, Any], WarmStart | None]:
    """The recipe this call trains with, and the warm start it uses (``None``: cold).

    ``max_epochs``/``seed`` arguments win over the file; a warm start that fits the configured
    architecture switches to ``training.yaml`` ``warm_start``'s epochs and learning rate.
    """
    settings = load_training_config(config)
    seed = int(settings["seed"] if seed is None else seed)
    if (
        warm_start is not None
        and settings["warm_start"]["enabled"]
        and fits(PerceptionModule.from_config(perception_spec(), settings, seed).net, warm_start)
    ):
        settings = warm_start_settings(settings, explicit_max_epochs=max_epochs is not None)
    else:
        warm_start = None
    max_epochs = int(settings["max_epochs"] if max_epochs is None else max_epochs)
    if max_epochs < 1:
        raise ValueError(f"max_epochs must be >= 1, got {max_epochs}")
    CheckpointRetention.from_config(settings["checkpoint"])  # bad retention fails up front
    return {**settings, "seed": seed, "max_epochs": max_epochs}, warm_start


def _hyperparameters(
    settings: Mapping[str, Any],
    train_frames: pd.DataFrame,
    val_frames: pd.DataFrame,
    warm_start: WarmStart | None,
    teacher: Teacher | None,
    transfer_frames: pd.DataFrame | None,
) -> dict[str, str]:
    """The run's MLflow params that a resume must match: the recipe, the data it saw and the
    teacher it learned from."""
    transfer = transfer_frames if transfer_frames is not None else pd.DataFrame({"image": []})
    return {
        **flatten_params(settings),
        "train_frames": str(len(train_frames)),
        "val_frames": str(len(val_frames)),
        "transfer_frames": str(len(transfer)),
        "train_data_sha256": _frames_fingerprint(train_frames),
        "val_data_sha256": _frames_fingerprint(val_frames),
        "transfer_data_sha256": _frames_fingerprint(transfer, ("image",)),
        "warm_start_from": "none" if warm_start is None else warm_start.source,
        "distilled_from": "none" if teacher is None else teacher.source,
    }


def _prepare(
    train_frames: pd.DataFrame,
    val_frames: pd.DataFrame,
    settings: Mapping[str, Any],
    warm_start: WarmStart | None,
    teacher: Teacher | None,
    transfer_frames: pd.DataFrame | None,
) -> tuple[PerceptionDataModule, PerceptionModule]:
    """Seeded datamodule and module; validates the tables before any run or file exists."""
    seed = int(settings["seed"])
    L.seed_everything(seed, workers=True, verbose=False)
    spec = perception_spec()
    datamodule = PerceptionDataModule.from_config(
        train_frames, val_frames, settings, seed=seed, spec=spec, transfer_frames=transfer_frames
    )
    module = PerceptionModule.from_config(spec, settings, seed)
    if warm_start is not None:
        module.net.load_state_dict(dict(warm_start.state_dict))
    if teacher is not None:
        distillation = settings["distillation"]
        module.attach_teacher(
            teacher.network, float(distillation["weight"]), float(distillation["temperature"])
        )
    return datamodule, module


def _finish(
    module: PerceptionModule,
    datamodule: PerceptionDataModule,
    settings: Mapping[str, Any],
    run: TrackedRun,
    last: Path,
    resumed_from: int | None,
    warm_start: WarmStart | None,
    teacher: Teacher | None,
) -> TrainingResult:
    """Final metrics over the whole val set, recorded in the run (rank 0), as the result."""
    epochs_done = completed_epochs(last)
    network = module.net.eval().cpu()
    final = evaluate_network(
        network,
        datamodule.val_dataset,
        batch_size=datamodule.batch_size,
        occupancy_threshold=float(settings["metrics"]["occupancy_threshold"]),
        lead_gap_weight=float(settings["loss"]["lead_gap_weight"]),
        smooth_l1_beta=float(settings["loss"]["smooth_l1_beta"]),
        cell_weights=module.cell_weights.cpu(),
        pos_weight=float(module.hparams.pos_weight),
    )
    model_uri = ""
    if run.run_id is not None:
        model_uri = record_outcome(
            settings, run.experiment_id, run.run_id, network, final, last, epochs_done
        )
    return TrainingResult(
        network=network,
        mlflow_run_id=run.run_id or "",
        epochs_completed=epochs_done,
        resumed_from_epoch=resumed_from,
        metrics=final,
        checkpoint_path=last,
        model_uri=model_uri,
        experiment_id=run.experiment_id,
        warm_start_from="none" if warm_start is None else warm_start.source,
        distilled_from="none" if teacher is None else teacher.source,
        transfer_frames=datamodule.train_dataset.transfer_count,
    )


def train_perception_model(
    train_frames: pd.DataFrame,
    val_frames: pd.DataFrame,
    *,
    checkpoint_dir: Path,
    mlflow_tracking_uri: str,
    experiment: str,
    run_tags: Mapping[str, str],
    params: Mapping[str, str],
    config: Mapping[str, Any] | None = None,
    max_epochs: int | None = None,
    seed: int | None = None,
    artifact_location: str | None = None,
    warm_start: WarmStart | None = None,
    teacher: Teacher | None = None,
    transfer_frames: pd.DataFrame | None = None,
) -> TrainingResult:
    """Train (or resume training) the perception network and record it in MLflow.

    ``train_frames``/``val_frames`` are frames tables already split by log (a shared log is a
    ``ValueError``). ``params`` (dataset commit id, code version, Dagster run id, …) join the
    hyperparameters as MLflow params; ``run_tags`` become run tags. ``config`` overrides
    sections of ``resources/training.yaml``; ``max_epochs``/``seed`` override its top-level
    values. ``artifact_location`` applies when the experiment is created; by default artifacts
    sit beside a sqlite tracking DB (``<db dir>/mlartifacts/<experiment>``).

    Re-running with the same ``checkpoint_dir`` after a kill resumes from ``last.ckpt`` in the
    same MLflow run; re-running after completion trains nothing and returns the same model.

    ``warm_start`` starts from a released model's weights (``training.yaml`` ``warm_start``:
    its epochs and learning-rate scale apply) when they fit the configured architecture, and
    from a random initialization otherwise.

    ``teacher`` (a larger trained network) adds ``training.yaml`` ``distillation``'s loss
    against its readings when ``distillation.enabled``; it is ignored otherwise, and recorded
    as the run's ``distilled_from`` param either way it is used.

    ``transfer_frames`` (frames without labels, split from val by log) join the training set
    and are learned from the teacher's readings alone: a transfer set, where distillation pays
    (docs/training.md). Without a teacher they are refused.
    """
    settings, warm_start = _resolve_settings(config, max_epochs, seed, warm_start)
    if not settings["distillation"]["enabled"]:
        teacher = None
    _check_split(train_frames, val_frames)
    transfer_frames = _check_transfer(transfer_frames, val_frames, teacher)
    with preserved_torch_determinism():
        datamodule, module = _prepare(
            train_frames, val_frames, settings, warm_start, teacher, transfer_frames
        )
        checkpoint_dir = Path(checkpoint_dir)
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        rank_zero = rank_zero_only.rank == 0
        with exclusive(checkpoint_dir, rank_zero), tracking_uri_scope(mlflow_tracking_uri):
            last, resumed_from = resume_point(checkpoint_dir)
            with tracked_run(
                checkpoint_dir,
                tracking_uri=mlflow_tracking_uri,
                experiment=experiment,
                artifact_location=artifact_location,
                tags=run_tags,
                hyperparameters=_hyperparameters(
                    settings, train_frames, val_frames, warm_start, teacher, transfer_frames
                ),
                caller_params=params,
                resumed_from=resumed_from,
                rank_zero=rank_zero,
            ) as run:
                if resumed_from is not None:
                    logger.info("resuming from %s after %d epochs", last, resumed_from)
                epochs = settings["max_epochs"]
                callbacks = [MlflowEpochLogger(mlflow_tracking_uri, run.run_id, epochs)]
                trainer = build_trainer(settings, checkpoint_dir, epochs, callbacks)
                fit(module, datamodule, trainer, last if resumed_from is not None else None)
                return _finish(
                    module, datamodule, settings, run, last, resumed_from, warm_start, teacher
                )
