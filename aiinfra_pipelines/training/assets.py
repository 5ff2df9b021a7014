"""Training asset (group ``training``): the perception model on the latest dataset version."""

from typing import Any

import dagster as dg

from aiinfra_pipelines.datasets.assets import training_dataset
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.runs import RESOURCE_TAG

from .metadata import trained_model_metadata
from .resources import MlflowTracking
from .training_run import code_version, environment_training_overrides, train_and_register

__all__ = ["code_version", "environment_training_overrides", "trained_model"]

GROUP = "training"


@dg.asset(
    group_name=GROUP,
    kinds={"pytorch", "mlflow"},
    deps=[training_dataset],
    pool="gpu",
    tags={RESOURCE_TAG: "gpu"},
)
def trained_model(
    context: dg.AssetExecutionContext, lake: VersionedLake, mlflow_tracking: MlflowTracking
) -> dict[str, Any]:
    """The perception network trained on the latest ``dataset-vNNNN``, tracked in MLflow.

    Checkpoints go to durable storage every epoch, keyed by dataset version: a re-run after
    the process was killed resumes from the last epoch instead of starting over.
    """
    model = train_and_register(lake, mlflow_tracking, context.run.run_id, context.log.info)
    context.add_output_metadata(trained_model_metadata(model))
    return model.to_dict()
