"""Training asset (group ``training``): the perception model on the latest dataset version."""

import io
import subprocess
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.config import PROJECT_ROOT
from aiinfra_pipelines.datasets.assets import TRAINING_LATEST, read_json_if_exists, training_dataset
from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.lake.port import VersionedLake

from .resources import MlflowTracking

GROUP = "training"


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


@dg.asset(
    group_name=GROUP,
    kinds={"pytorch", "mlflow"},
    deps=[training_dataset],
    pool="gpu",
    tags={"aiinfra/resource": "gpu"},
)
def trained_model(
    context: dg.AssetExecutionContext, lake: VersionedLake, mlflow_tracking: MlflowTracking
) -> dict[str, Any]:
    """The perception network trained on the latest ``dataset-vNNNN``, tracked in MLflow.

    Checkpoints go to durable storage every epoch, keyed by dataset version: a re-run after
    the process was killed resumes from the last epoch instead of starting over.
    """
    # Imported here: Lightning and MLflow cost seconds, and every run process loads this module.
    from .train import register_model_version, train_perception_model
    from .warm_start import reference_warm_start

    pointer = read_json_if_exists(lake, TRAINING_LATEST)
    if pointer is None:
        raise ValueError("no training dataset on main: materialize training_dataset first")
    rows = pd.read_parquet(io.BytesIO(lake.get_object(pointer["commit"], pointer["rows_key"])))
    frames = load_frames(lake, rows, pointer["commit"])
    lineage = {
        "dataset_version": pointer["version"],
        "dataset_commit": pointer["commit"],
        "code_version": code_version(),
        "dagster_run_id": context.run.run_id,
    }
    overrides = environment_training_overrides()
    warm_start = reference_warm_start(lake, mlflow_tracking.uri(), overrides)
    result = train_perception_model(
        frames[frames["split"] == "train"],
        frames[frames["split"] == "val"],
        checkpoint_dir=mlflow_tracking.checkpoints() / pointer["version"],
        mlflow_tracking_uri=mlflow_tracking.uri(),
        experiment=mlflow_tracking.experiment,
        run_tags={"dagster_run_id": context.run.run_id, "dataset_version": pointer["version"]},
        params=lineage,
        config=overrides,
        warm_start=warm_start,
    )
    context.log.info(f"trained from {result.warm_start_from}")
    registered = register_model_version(
        mlflow_tracking.uri(),
        result.model_uri,
        result.mlflow_run_id,
        tags={**lineage, "mlflow_run_id": result.mlflow_run_id},
    )
    metrics = {name: round(float(value), 4) for name, value in result.metrics.items()}
    context.add_output_metadata(
        {
            "registered_model": registered.registered_model,
            "model_version": registered.version,
            "mlflow_run_id": result.mlflow_run_id,
            "dataset_version": pointer["version"],
            "dataset_commit": pointer["commit"],
            "epochs": result.epochs_completed,
            "warm_start_from": result.warm_start_from,
            "resumed_from_epoch": result.resumed_from_epoch
            if result.resumed_from_epoch is not None
            else -1,
            "metrics": dg.MetadataValue.json(metrics),
        }
    )
    return {
        "registered_model": registered.registered_model,
        "model_version": registered.version,
        "mlflow_run_id": result.mlflow_run_id,
        "model_uri": result.model_uri,
        "dataset_version": pointer["version"],
        "dataset_commit": pointer["commit"],
        "dataset_rows_key": pointer["rows_key"],
        "code_version": lineage["code_version"],
        "epochs": result.epochs_completed,
        "metrics": metrics,
    }
