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
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import lightning as L
import mlflow
import numpy as np
import pandas as pd
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_only
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.network import PerceptionNet

from .datamodule import PerceptionDataModule, PerceptionDataset
from .module import EPOCH_METRICS, VAL_LOSS, PerceptionModule, perception_loss, validation_scores
from .resources import mlflow_tracking_uri as tracking_uri_scope

logger = logging.getLogger(__name__)

CONFIG_FILE = "training.yaml"
LAST_CHECKPOINT = "last.ckpt"
RUN_ID_FILE = "mlflow_run_id"
LOCK_FILE = ".training.lock"
RESUMED_TAG = "aiinfra.resumed_from_epoch"
_EXPECTED_LIGHTNING_WARNINGS = (
    r"Checkpoint directory .* exists and is not empty",
    r"You have overridden `on_after_batch_transfer` in `LightningModule`",
)


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


@dataclass(frozen=True)
class WarmStart:
    """Weights to start from instead of a random initialization: a released model's.

    ``source`` names them (an MLflow model URI and version) and is recorded as the run's
    ``warm_start_from`` param, so a model's lineage includes the model it grew from.
    """

    state_dict: Mapping[str, torch.Tensor]
    source: str


def _warm_start_settings(settings: dict[str, Any], explicit_max_epochs: bool) -> dict[str, Any]:
    """``training.yaml`` ``warm_start``: fewer epochs at a scaled learning rate."""
    section = settings["warm_start"]
    optimizer = {**settings["optimizer"]}
    optimizer["lr"] = float(optimizer["lr"]) * float(section["lr_scale"])
    updated = {**settings, "optimizer": optimizer}
    if not explicit_max_epochs:
        updated["max_epochs"] = int(section["max_epochs"])
    return updated


def _fits(network: PerceptionNet, warm_start: WarmStart) -> bool:
    """Whether ``warm_start``'s weights fit ``network`` tensor for tensor.

    A recipe change that alters the architecture makes the released weights unusable; that
    is a reason to train from scratch (the full cold recipe), not to fail the retraining.
    """
    own = network.state_dict()
    theirs = dict(warm_start.state_dict)
    mismatched = sorted(
        key
        for key in set(own) | set(theirs)
        if key not in own or key not in theirs or own[key].shape != theirs[key].shape
    )
    if mismatched:
        logger.warning(
            "cold start: %s does not fit this architecture (%d tensors differ, e.g. %s)",
            warm_start.source,
            len(mismatched),
            mismatched[0],
        )
    return not mismatched


# -- configuration ---------------------------------------------------------------------------


def _deep_merge(
    base: dict[str, Any], overrides: Mapping[str, Any], path: str = ""
) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in; a key ``base`` does not have is a typo: refuse it."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if key not in base:
            raise ValueError(f"unknown training config key {path}{key!r} (not in {CONFIG_FILE})")
        if isinstance(value, Mapping) and isinstance(base[key], dict):
            merged[key] = _deep_merge(base[key], value, f"{path}{key}.")
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_training_config(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``resources/training.yaml`` with ``overrides`` merged in section by section.

    Overrides are partial (``{"data": {"num_workers": 0}}`` keeps the other data settings), so
    tests and the asset's run config change one knob without restating the file; a key the
    file does not define raises ``ValueError`` instead of being silently ignored.
    """
    return _deep_merge(load_resource_yaml(CONFIG_FILE), overrides or {})


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config → MLflow params ``section.key = value`` (MLflow params are flat strings)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


# -- durable checkpoints -------------------------------------------------------------------


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` survive a power loss, not only a process kill."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic_write_bytes(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


class DurableCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a sibling temporary file, fsynced, then renamed into place.

    Lightning's own save stages through a temp file in the system temp dir and moves it, which
    is a copy (not atomic) when that dir is on another filesystem, and never fsyncs. Here a
    SIGKILL or power loss at any instant leaves either the previous or the new ``last.ckpt``,
    never a torn one that would make the resume itself crash.
    """

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | Path,
        storage_options: Any | None = None,
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        _atomic_write_bytes(Path(path), lambda handle: torch.save(checkpoint, handle))


def completed_epochs(checkpoint_path: Path) -> int:
    """Epochs fully trained in a Lightning checkpoint saved at the end of a training epoch."""
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    progress = checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]
    return int(progress["processed"])


@contextlib.contextmanager
def _exclusive(checkpoint_dir: Path) -> Iterator[None]:
    """Refuse a second concurrent training into the same directory.

    A POSIX record lock (``lockf``) belongs to the process: the kernel drops it when the
    process dies, so a killed run never leaves a stale lock, and DataLoader workers forked
    from it do not inherit it.
    """
    handle = open(checkpoint_dir / LOCK_FILE, "a+b")  # noqa: SIM115 - held for the block
    try:
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            raise RuntimeError(
                f"another process is training into {checkpoint_dir} (lock {LOCK_FILE} is held)"
            ) from error
        for stale in checkpoint_dir.glob(".*.tmp"):  # half-written files of a killed run
            stale.unlink(missing_ok=True)
        yield
    finally:
        handle.close()


# -- MLflow --------------------------------------------------------------------------------


def _default_artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """Artifacts beside a sqlite tracking DB (MLflow would otherwise write ./mlruns in CWD)."""
    parsed = urlparse(tracking_uri)
    if parsed.scheme != "sqlite" or not parsed.path or parsed.path == "/:memory:":
        return None
    database = Path(tracking_uri[len("sqlite:///") :])
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in experiment)
    return (database.resolve().parent / "mlartifacts" / safe).as_uri()


def _experiment_id(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:  # created concurrently by another process
        existing = client.get_experiment_by_name(name)
        if existing is None:
            raise
        return existing.experiment_id


def _stored_run_id(checkpoint_dir: Path, client: MlflowClient, experiment_id: str) -> str | None:
    path = checkpoint_dir / RUN_ID_FILE
    if not path.is_file():
        return None
    run_id = path.read_text(encoding="utf-8").strip()
    try:
        run = client.get_run(run_id)
    except MlflowException as error:
        raise ValueError(
            f"{path} names MLflow run {run_id!r}, which the tracking server does not know; "
            "resume against the tracking URI that recorded it, or use a fresh checkpoint_dir"
        ) from error
    if run.info.experiment_id != experiment_id:
        raise ValueError(
            f"{path} names MLflow run {run_id!r} of experiment {run.info.experiment_id}, "
            f"not of the requested experiment {experiment_id}"
        )
    return run_id


def _log_params(
    client: MlflowClient,
    run_id: str,
    hyperparameters: Mapping[str, str],
    caller_params: Mapping[str, str],
) -> None:
    """Log params once; on a resumed run, compare instead of overwriting.

    MLflow params are immutable. A hyperparameter (or data fingerprint) that differs from the
    resumed run's means the checkpoint belongs to a different training: refuse. A caller param
    that differs (typically the Dagster run id of the re-execution) is kept as-is and the new
    value recorded as a ``resumed.<key>`` tag.
    """
    clashes = sorted(set(hyperparameters) & set(caller_params))
    if clashes:
        raise ValueError(f"params {clashes} collide with training hyperparameter names")
    existing = client.get_run(run_id).data.params
    changed = {
        key: (existing[key], value)
        for key, value in hyperparameters.items()
        if key in existing and existing[key] != value
    }
    if changed:
        detail = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
        raise ValueError(
            f"cannot resume MLflow run {run_id}: its checkpoint was trained with different "
            f"settings or data ({detail}); use a fresh checkpoint_dir"
        )
    for key, value in caller_params.items():
        if key in existing and existing[key] != value:
            client.set_tag(run_id, f"resumed.{key}", value)
    fresh = {
        key: value
        for key, value in {**hyperparameters, **caller_params}.items()
        if key not in existing
    }
    items = [mlflow.entities.Param(key, value) for key, value in fresh.items()]
    for start in range(0, len(items), 100):  # MLflow's per-request param limit
        client.log_batch(run_id, params=items[start : start + 100])


class MlflowEpochLogger(Callback):
    """Per-epoch metrics into an MLflow run (step = epoch), plus one log line per epoch.

    Runs on ``on_train_epoch_end`` *before* ModelCheckpoint saves (Lightning calls
    checkpoint callbacks' epoch-end hooks after all others), so when the checkpoint of epoch k
    exists, MLflow already has epoch k's metrics and a kill can never leave a hole in the
    history. (A kill between the two only means epoch k is trained and logged again, with
    identical values, after the resume.) Holds only the URI and run id, so it
    pickles into ``ddp_spawn`` workers.
    """

    def __init__(self, tracking_uri: str | None, run_id: str | None, max_epochs: int) -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.max_epochs = max_epochs

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        epoch = trainer.current_epoch
        values = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if isinstance(value, torch.Tensor) and value.numel() == 1
        }
        values["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        summary = "  ".join(
            f"{name}={values[name]:.4f}" for name in EPOCH_METRICS if name in values
        )
        logger.info("epoch %d/%d  %s", epoch + 1, self.max_epochs, summary)
        if self.tracking_uri is None or self.run_id is None:
            return
        client = MlflowClient(tracking_uri=self.tracking_uri)
        client.log_batch(
            self.run_id,
            metrics=[
                mlflow.entities.Metric(name, value, int(time.time() * 1000), epoch)
                for name, value in sorted(values.items())
            ],
        )


def _logged_model_uri(experiment_id: str, run_id: str, name: str) -> str | None:
    """The model this run already logged under ``name`` (a re-run after the upload)."""
    models = mlflow.search_logged_models(
        experiment_ids=[experiment_id],
        filter_string=f"source_run_id = '{run_id}' AND name = '{name}'",
        output_format="list",
    )
    return f"models:/{models[0].model_id}" if models else None


def _log_model(network: PerceptionNet, name: str, serialization_format: str) -> str:
    """``mlflow.pytorch.log_model`` (MLflow 3: ``name=``, a LoggedModel linked to the run).

    Requirements are pinned explicitly rather than inferred: inference re-imports the model
    in a subprocess, seconds of work that would only rediscover torch and numpy.
    """
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    spec = network.spec
    signature = ModelSignature(
        inputs=Schema(
            [TensorSpec(np.dtype(np.float32), (-1, 3, spec.image_height, spec.image_width))]
        )
    )
    info = mlflow.pytorch.log_model(
        network,
        name=name,
        signature=signature,
        serialization_format=serialization_format,
        pip_requirements=[
            f"torch=={torch.__version__.split('+')[0]}",
            f"numpy=={np.__version__}",
        ],
    )
    return info.model_uri


def _record_outcome(
    settings: Mapping[str, Any],
    experiment_id: str,
    run_id: str,
    network: PerceptionNet,
    final: Mapping[str, float],
    last: Path,
    epochs_done: int,
) -> str:
    """Final metrics, the checkpoint and the model into the active run; returns the model URI.

    Idempotent for the model: a call that resumes an already finished run finds the model it
    logged before instead of registering a second one.
    """
    section = settings["mlflow"]
    mlflow.log_metrics({f"final_{name}": value for name, value in final.items()})
    mlflow.log_metric("epochs_completed", epochs_done)
    mlflow.log_artifact(str(last), artifact_path=section["checkpoint_artifact_path"])
    name = section["model_name"]
    existing = _logged_model_uri(experiment_id, run_id, name)
    return existing or _log_model(network, name, section["serialization_format"])


@dataclass(frozen=True)
class RegisteredVersion:
    """A model version in the MLflow Model Registry: the candidate's identity downstream."""

    registered_model: str
    version: str


def register_model_version(
    tracking_uri: str,
    model_uri: str,
    mlflow_run_id: str,
    tags: Mapping[str, str],
    config: Mapping[str, Any] | None = None,
) -> RegisteredVersion:
    """Register the run's model as a version of ``mlflow.registered_model`` and alias it.

    One MLflow run is one version: a re-executed asset whose training resumed an already
    finished run finds the version registered before instead of minting a second candidate.
    ``tags`` (dataset commit, code version, Dagster run, ...) are (re)set on the version, and the
    ``mlflow.candidate_alias`` alias is moved to it.
    """
    section = load_training_config(config)["mlflow"]
    name = str(section["registered_model"])
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    try:
        client.get_registered_model(name)
    except MlflowException:
        with contextlib.suppress(MlflowException):  # created concurrently by another process
            client.create_registered_model(name)
    existing = client.search_model_versions(f"name = '{name}' and run_id = '{mlflow_run_id}'")
    if existing:
        version = str(min(int(found.version) for found in existing))
    else:
        with tracking_uri_scope(tracking_uri):
            version = str(mlflow.register_model(model_uri, name, tags=dict(tags)).version)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, str(value))
    client.set_registered_model_alias(name, str(section["candidate_alias"]), version)
    return RegisteredVersion(registered_model=name, version=version)


# -- evaluation ------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_network(
    network: PerceptionNet,
    dataset: PerceptionDataset,
    *,
    batch_size: int,
    occupancy_threshold: float,
    lead_gap_weight: float,
    smooth_l1_beta: float,
    cell_weights: torch.Tensor | None = None,
    pos_weight: float = 1.0,
) -> dict[str, float]:
    """val_* metrics of ``network`` (eval mode, its current device) over a whole dataset.

    ``val_loss`` is the training loss (same cell weights and ``pos_weight``), so the final
    value continues the per-epoch ``val_loss`` curve.
    """
    network.eval()
    device = next(network.parameters()).device
    parts: list[tuple[torch.Tensor, ...]] = []
    loss_sum = 0.0
    for start in range(0, len(dataset), batch_size):
        images = dataset.images[start : start + batch_size].to(device).float().div_(255.0)
        occupancy = dataset.occupancy[start : start + batch_size].to(device)
        lead_gap = dataset.lead_gap[start : start + batch_size].to(device)
        logits, gap_pred = network(images)
        total, _, _ = perception_loss(
            logits,
            gap_pred,
            occupancy,
            lead_gap,
            lead_gap_weight=lead_gap_weight,
            smooth_l1_beta=smooth_l1_beta,
            cell_weights=cell_weights,
            pos_weight=pos_weight,
        )
        loss_sum += float(total) * len(images)
        parts.append((torch.sigmoid(logits).cpu(), occupancy.cpu(), gap_pred.cpu(), lead_gap.cpu()))
    prob, target, gap_pred, gap_target = (
        torch.cat([p[i] for p in parts]).numpy() for i in range(4)
    )
    scores = validation_scores(
        prob,
        target,
        gap_pred,
        gap_target,
        threshold=occupancy_threshold,
        max_range_m=network.spec.max_range_m,
    )
    return {VAL_LOSS: loss_sum / len(dataset), **scores}


# -- the entry point -------------------------------------------------------------------------


def _frames_fingerprint(frames: pd.DataFrame) -> str:
    """SHA-256 over what training reads from each frame: a resume on other data is refused."""
    digest = hashlib.sha256()
    for column in ("image", "ground_truth", "lane_index", "lane_count"):
        for value in frames[column]:
            digest.update(value if isinstance(value, bytes) else str(value).encode())
            digest.update(b"\x00")
    return digest.hexdigest()


def _check_split(train_frames: pd.DataFrame, val_frames: pd.DataFrame) -> None:
    """A log in both splits leaks near-identical consecutive frames into validation."""
    if "log_id" not in train_frames or "log_id" not in val_frames:
        return
    shared = sorted(set(train_frames["log_id"]) & set(val_frames["log_id"]))
    if shared:
        more = f" and {len(shared) - 3} more" if len(shared) > 3 else ""
        raise ValueError(
            f"train and val frames share {len(shared)} log(s) ({', '.join(shared[:3])}{more}); "
            "split by log so validation measures generalization, not memory"
        )


def _torch_determinism() -> tuple[bool, bool, bool, bool]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )


def _restore_torch_determinism(state: tuple[bool, bool, bool, bool]) -> None:
    """Lightning's ``deterministic=True`` flips process-global torch flags and leaves them."""
    enabled, warn_only, cudnn_deterministic, cudnn_benchmark = state
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.backends.cudnn.deterministic = cudnn_deterministic
    torch.backends.cudnn.benchmark = cudnn_benchmark


def _trainer(
    config: dict[str, Any],
    checkpoint_dir: Path,
    max_epochs: int,
    callbacks: list[Callback],
) -> L.Trainer:
    settings = config["trainer"]
    checkpointing = config["checkpoint"]
    progress_bar = settings.get("enable_progress_bar")
    if progress_bar is None:
        progress_bar = sys.stderr.isatty()
    checkpoint = ModelCheckpoint(
        dirpath=checkpoint_dir,
        filename="epoch={epoch:03d}",
        auto_insert_metric_name=False,
        save_top_k=int(checkpointing["save_top_k"]),
        save_last=True,
        every_n_epochs=int(checkpointing["every_n_epochs"]),
        save_on_train_epoch_end=True,
        enable_version_counter=False,
    )
    return L.Trainer(
        accelerator=settings["accelerator"],
        devices=settings["devices"],
        strategy=settings["strategy"],
        num_nodes=int(settings["num_nodes"]),
        precision=settings["precision"],
        deterministic=settings["deterministic"],
        max_epochs=max_epochs,
        callbacks=[*callbacks, checkpoint],
        plugins=[DurableCheckpointIO()],
        logger=False,
        default_root_dir=checkpoint_dir,
        enable_progress_bar=bool(progress_bar),
        enable_model_summary=bool(settings["enable_model_summary"]),
        num_sanity_val_steps=int(settings["num_sanity_val_steps"]),
        gradient_clip_val=settings.get("gradient_clip_val"),
        log_every_n_steps=int(settings["log_every_n_steps"]),
    )


def _fit(
    module: PerceptionModule,
    datamodule: PerceptionDataModule,
    trainer: L.Trainer,
    resume_from: Path | None,
) -> None:
    """``trainer.fit``, continuing from ``resume_from`` (weights, optimizer, schedule, loops)."""
    with warnings.catch_warnings():
        # Expected here: the directory also holds the run id and the lock, and the module
        # (not the datamodule) owns on_after_batch_transfer.
        for message in _EXPECTED_LIGHTNING_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)


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
    """
    settings = load_training_config(config)
    seed = int(settings["seed"] if seed is None else seed)
    spec = perception_spec()
    if (
        warm_start is not None
        and settings["warm_start"]["enabled"]
        and _fits(PerceptionModule.from_config(spec, settings, seed).net, warm_start)
    ):
        settings = _warm_start_settings(settings, explicit_max_epochs=max_epochs is not None)
    else:
        warm_start = None
    max_epochs = int(settings["max_epochs"] if max_epochs is None else max_epochs)
    if max_epochs < 1:
        raise ValueError(f"max_epochs must be >= 1, got {max_epochs}")
    settings = {**settings, "seed": seed, "max_epochs": max_epochs}
    _check_split(train_frames, val_frames)

    determinism = _torch_determinism()
    L.seed_everything(seed, workers=True, verbose=False)
    # Validates both tables before any run or file exists (ValueError names the problem).
    datamodule = PerceptionDataModule.from_config(
        train_frames, val_frames, settings, seed=seed, spec=spec
    )
    module = PerceptionModule.from_config(spec, settings, seed)
    warm_from = "none"
    if warm_start is not None:
        module.net.load_state_dict(dict(warm_start.state_dict))
        warm_from = warm_start.source

    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    last = checkpoint_dir / LAST_CHECKPOINT
    rank_zero = rank_zero_only.rank == 0
    hyperparameters = {
        **flatten_params(settings),
        "train_frames": str(len(train_frames)),
        "val_frames": str(len(val_frames)),
        "train_data_sha256": _frames_fingerprint(train_frames),
        "val_data_sha256": _frames_fingerprint(val_frames),
        "warm_start_from": warm_from,
    }
    caller_params = {str(key): str(value) for key, value in params.items()}
    tags = {str(key): str(value) for key, value in run_tags.items()}

    exclusive = _exclusive(checkpoint_dir) if rank_zero else contextlib.nullcontext()
    try:
        with exclusive, tracking_uri_scope(mlflow_tracking_uri):
            resumed_from = completed_epochs(last) if last.is_file() else None
            client = MlflowClient(tracking_uri=mlflow_tracking_uri)
            experiment_id, run_context = "", contextlib.nullcontext()
            if rank_zero:
                experiment_id = _experiment_id(
                    client,
                    experiment,
                    artifact_location
                    or _default_artifact_location(mlflow_tracking_uri, experiment),
                )
                stored_run_id = _stored_run_id(checkpoint_dir, client, experiment_id)
                if resumed_from is not None:
                    tags[RESUMED_TAG] = str(resumed_from)
                # Resumes the stored run (status back to RUNNING) or creates one; the context
                # marks it FINISHED on success and FAILED when an exception escapes.
                run_context = mlflow.start_run(
                    run_id=stored_run_id,
                    experiment_id=None if stored_run_id else experiment_id,
                    tags=tags,
                )
            with run_context as run:
                run_id = run.info.run_id if rank_zero else None
                if run_id is not None:
                    _atomic_write_bytes(
                        checkpoint_dir / RUN_ID_FILE, lambda handle: handle.write(run_id.encode())
                    )
                    _log_params(client, run_id, hyperparameters, caller_params)
                if resumed_from is not None:
                    logger.info("resuming from %s after %d epochs", last, resumed_from)
                _fit(
                    module,
                    datamodule,
                    _trainer(
                        settings,
                        checkpoint_dir,
                        max_epochs,
                        [MlflowEpochLogger(mlflow_tracking_uri, run_id, max_epochs)],
                    ),
                    resume_from=last if resumed_from is not None else None,
                )
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
                if run_id is not None:
                    model_uri = _record_outcome(
                        settings, experiment_id, run_id, network, final, last, epochs_done
                    )
    finally:
        _restore_torch_determinism(determinism)

    return TrainingResult(
        network=network,
        mlflow_run_id=run_id or "",
        epochs_completed=epochs_done,
        resumed_from_epoch=resumed_from,
        metrics=final,
        checkpoint_path=last,
        model_uri=model_uri,
        experiment_id=experiment_id,
        warm_start_from=warm_from,
    )
