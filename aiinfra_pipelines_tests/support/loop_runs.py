"""Driving a fleet batch through ingestion and mining with ``dg.materialize``, for loop tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import dagster as dg

from aiinfra_pipelines.datasets import definitions as dataset_layer
from aiinfra_pipelines.deployment import definitions as deployment_layer
from aiinfra_pipelines.evaluation import definitions as evaluation_layer
from aiinfra_pipelines.ingest import definitions as ingest_layer
from aiinfra_pipelines.ingest.partitions import BatchRef, ingest_batch_partitions
from aiinfra_pipelines.ingest.resources import AnonymizationKey
from aiinfra_pipelines.lake.io_manager import LakeIOManager
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.mining import definitions as mining_layer
from aiinfra_pipelines.training import definitions as training_layer
from aiinfra_pipelines.training.resources import MlflowTracking
from aiinfra_pipelines_tests.support.ingest_runs import land

PER_BATCH_GROUPS = ("ingest", "mining")
MODEL_GROUPS = ("datasets", "training", "evaluation")
# Kept apart from MODEL_GROUPS: the training-cycle tests count that run's asset checks.
DEPLOYMENT_GROUPS = ("deployment",)


def loop_resources(lake: LocalLake, workdir: Path) -> dict:
    return {
        "lake": lake,
        "io_manager": LakeIOManager(lake=lake),
        "anonymization": AnonymizationKey(key_hex="ab" * 32),
        "mlflow_tracking": MlflowTracking(
            tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}",
            checkpoint_root=str(workdir / "checkpoints"),
        ),
    }


def all_assets_and_checks() -> list:
    """Every layer's assets and checks, unbound (the test supplies the resources)."""
    layers = [
        ingest_layer,
        mining_layer,
        dataset_layer,
        training_layer,
        evaluation_layer,
        deployment_layer,
    ]
    return [
        item for layer in layers for item in [*layer.defs.assets, *(layer.defs.asset_checks or [])]
    ]


def ingest_and_mine(
    instance: dg.DagsterInstance,
    resources: dict,
    batch_id: str,
    logs: Sequence[DriveLog],
    groups: Sequence[str] = PER_BATCH_GROUPS,
) -> list[str]:
    """Land ``logs`` as one batch and run the per-batch ``groups`` on it; returns [partition]."""
    batch = land(resources["lake"], batch_id, [(log.log_id, log) for log in logs])
    partitions = [BatchRef(batch.branch, batch.commit).partition_key]
    instance.add_dynamic_partitions(ingest_batch_partitions.name, partitions)
    materialize_per_batch(instance, resources, partitions, groups)
    return partitions


def materialize_per_batch(
    instance: dg.DagsterInstance,
    resources: dict,
    partitions: Sequence[str],
    groups: Sequence[str],
) -> None:
    """One run per batch partition over ``groups`` (what the ingest and automation sensors do)."""
    assets = all_assets_and_checks()
    for partition in partitions:
        result = dg.materialize(
            assets,
            selection=dg.AssetSelection.groups(*groups),
            instance=instance,
            resources=resources,
            partition_key=partition,
        )
        assert result.success


def run_training_cycle(
    instance: dg.DagsterInstance, resources: dict, raise_on_error: bool = True
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        all_assets_and_checks(),
        selection=dg.AssetSelection.groups(*MODEL_GROUPS),
        instance=instance,
        resources=resources,
        raise_on_error=raise_on_error,
    )


def run_deployment(
    instance: dg.DagsterInstance, resources: dict, raise_on_error: bool = True
) -> dg.ExecuteInProcessResult:
    """The deployment group on the published candidate (what ``training_cycle`` runs last)."""
    return dg.materialize(
        all_assets_and_checks(),
        selection=dg.AssetSelection.groups(*DEPLOYMENT_GROUPS),
        instance=instance,
        resources=resources,
        raise_on_error=raise_on_error,
    )
