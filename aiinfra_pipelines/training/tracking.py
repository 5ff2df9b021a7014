"""MLflow bookkeeping for a training: the run, its params and per-epoch metrics, the model.

One call of ``train_perception_model`` is one MLflow run. The run id is stored next to the
checkpoints so a resumed training keeps logging into the same run, and params are compared
(not overwritten) on resume so a checkpoint is never continued with other settings or data.
Only global rank 0 talks to MLflow.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import lightning as L
import mlflow
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from aiinfra_pipelines.perception.network import PerceptionNet

from .checkpointing import RUN_ID_FILE, atomic_write_bytes
from .module import EPOCH_METRICS
from .resources import mlflow_tracking_uri as tracking_uri_scope
from .settings import load_training_config

logger = logging.getLogger(__name__)

RESUMED_TAG = "aiinfra.resumed_from_epoch"


@dataclass(frozen=True)
class TrackedRun:
    """The MLflow run a training logs into; empty ids on ranks other than global zero."""

    run_id: str | None
    experiment_id: str


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


@contextlib.contextmanager
def tracked_run(
    checkpoint_dir: Path,
    *,
    tracking_uri: str,
    experiment: str,
    artifact_location: str | None,
    tags: Mapping[str, str],
    hyperparameters: Mapping[str, str],
    caller_params: Mapping[str, str],
    resumed_from: int | None,
    rank_zero: bool,
) -> Iterator[TrackedRun]:
    """The training's MLflow run, resumed from ``checkpoint_dir``'s run id or created.

    Resuming sets the stored run back to RUNNING; leaving the block marks it FINISHED, or FAILED
    when an exception escapes. The run id is written into ``checkpoint_dir`` and the params
    logged (or checked against the resumed run's) before the block runs.
    """
    if not rank_zero:
        yield TrackedRun(run_id=None, experiment_id="")
        return
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = _experiment_id(
        client,
        experiment,
        artifact_location or _default_artifact_location(tracking_uri, experiment),
    )
    stored_run_id = _stored_run_id(checkpoint_dir, client, experiment_id)
    run_tags = {str(key): str(value) for key, value in tags.items()}
    if resumed_from is not None:
        run_tags[RESUMED_TAG] = str(resumed_from)
    with mlflow.start_run(
        run_id=stored_run_id,
        experiment_id=None if stored_run_id else experiment_id,
        tags=run_tags,
    ) as run:
        run_id: str = run.info.run_id
        atomic_write_bytes(
            checkpoint_dir / RUN_ID_FILE, lambda handle: handle.write(run_id.encode())
        )
        _log_params(
            client,
            run_id,
            hyperparameters,
            {str(key): str(value) for key, value in caller_params.items()},
        )
        yield TrackedRun(run_id=run_id, experiment_id=experiment_id)


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


def record_outcome(
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
