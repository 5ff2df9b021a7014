"""Training assets (group ``training``): the cloud teacher and the car's network, both on the
latest dataset version."""

from typing import Any

import dagster as dg

from aiinfra_pipelines.datasets.assets import training_dataset
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.runs import RESOURCE_TAG

from .metadata import trained_model_metadata
from .resources import MlflowTracking
from .teacher import distillation_enabled, load_teacher
from .training_run import (
    code_version,
    environment_training_overrides,
    train_and_register,
    train_teacher_and_register,
)

__all__ = ["code_version", "environment_training_overrides", "teacher_model", "trained_model"]

GROUP = "training"


@dg.asset(
    group_name=GROUP,
    kinds={"pytorch", "mlflow"},
    deps=[training_dataset],
    pool="gpu",
    tags={RESOURCE_TAG: "gpu"},
)
def teacher_model(
    context: dg.AssetExecutionContext, lake: VersionedLake, mlflow_tracking: MlflowTracking
) -> dict[str, Any]:
    """The cloud teacher (``training.yaml`` ``teacher``) on the latest ``dataset-vNNNN``.

    A larger network than the car can run, registered as its own model; the car's network is
    distilled from it. With ``distillation.enabled`` off nothing is trained and the output says
    so (the student then learns from the labels alone).
    """
    if not distillation_enabled(environment_training_overrides()):
        context.log.info("distillation disabled (training.yaml distillation.enabled): no teacher")
        context.add_output_metadata({"trained": False})
        return {"trained": False}
    model = train_teacher_and_register(lake, mlflow_tracking, context.run.run_id, context.log.info)
    context.add_output_metadata({"trained": True, **trained_model_metadata(model)})
    return {"trained": True, **model.to_dict()}


@dg.asset(
    group_name=GROUP,
    kinds={"pytorch", "mlflow"},
    deps=[training_dataset],
    pool="gpu",
    tags={RESOURCE_TAG: "gpu"},
)
def trained_model(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    teacher_model: dict[str, Any],
) -> dict[str, Any]:
    """The car's perception network trained on the latest ``dataset-vNNNN``, tracked in MLflow,
    distilled from the cycle's ``teacher_model``.

    Checkpoints go to durable storage every epoch, keyed by dataset version: a re-run after
    the process was killed resumes from the last epoch instead of starting over.
    """
    teacher = None
    if teacher_model.get("trained"):
        teacher = load_teacher(
            teacher_model["model_uri"], str(teacher_model["model_version"]), mlflow_tracking.uri()
        )
    model = train_and_register(
        lake, mlflow_tracking, context.run.run_id, context.log.info, teacher=teacher
    )
    context.add_output_metadata(trained_model_metadata(model))
    return model.to_dict()
