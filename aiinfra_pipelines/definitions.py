"""The code location: every layer's definitions merged, with the environment's resources.

``AIINFRA_ENV`` (local / ci / prod) picks the resources and executor; the assets, checks and
sensors are the same everywhere.
"""

from __future__ import annotations

import dagster as dg

from aiinfra_pipelines.curation import definitions as curation_layer
from aiinfra_pipelines.datasets import definitions as dataset_layer
from aiinfra_pipelines.deployment import definitions as deployment_layer
from aiinfra_pipelines.environment import build_resources, load_environment
from aiinfra_pipelines.evaluation import definitions as evaluation_layer
from aiinfra_pipelines.ingest import definitions as ingest_layer
from aiinfra_pipelines.mining import definitions as mining_layer
from aiinfra_pipelines.operations import definitions as operations_layer
from aiinfra_pipelines.release import definitions as release_layer
from aiinfra_pipelines.sensors import definitions as sensor_layer
from aiinfra_pipelines.simulation import definitions as simulation_layer
from aiinfra_pipelines.training import definitions as training_layer


def _executor(name: str) -> dg.ExecutorDefinition:
    if name == "in_process":
        return dg.in_process_executor
    if name == "multiprocess":
        return dg.multiprocess_executor
    if name == "k8s":
        # One pod per step. Pod settings (the GPU pool's node selector, GPUs, shared
        # checkpoint volume) are configuration (resources/deploy/k8s_executor.yaml, checked
        # against dagster-k8s's schema by the deploy tests); building it contacts no cluster.
        from dagster_k8s import k8s_job_executor

        from aiinfra_pipelines.config import load_resource_yaml

        return k8s_job_executor.configured(
            load_resource_yaml("deploy/k8s_executor.yaml"), name="k8s"
        )
    raise ValueError(f"unknown executor {name!r}")


def build_definitions(environment: str | None = None) -> dg.Definitions:
    settings = load_environment(environment)
    return dg.Definitions.merge(
        ingest_layer.defs,
        mining_layer.defs,
        curation_layer.defs,
        dataset_layer.defs,
        training_layer.defs,
        evaluation_layer.defs,
        deployment_layer.defs,
        simulation_layer.defs,
        release_layer.defs,
        operations_layer.defs,
        sensor_layer.defs,
        dg.Definitions(
            resources=build_resources(environment), executor=_executor(settings["executor"])
        ),
    )


defs = build_definitions()
