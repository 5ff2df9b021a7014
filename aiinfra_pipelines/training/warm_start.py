"""Which weights a retraining starts from: the reference release's, else the last model trained.

Each cycle adds data; training every candidate from scratch on all of it grows the cost with
the fleet's history. Starting from the newest release (what the fleet runs or is moving to)
keeps what earlier cycles learned and fine-tunes on everything published. Before the first
release, the previous cycle's candidate (registered, even if a gate refused it: it learned
from a subset of today's data) is the best starting point there is; only the very first
training starts cold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.release.reference import reference_release

from .resources import mlflow_tracking_uri
from .train import WarmStart, load_training_config


def reference_warm_start(
    lake: VersionedLake, tracking_uri: str, overrides: Mapping[str, Any] | None = None
) -> WarmStart | None:
    """The reference release's network weights (``release.reference``), or ``None``.

    Falls back to the newest registered version of the model (the previous candidate) when
    there is no release yet; ``None`` when ``training.yaml`` ``warm_start.enabled`` is off
    (after the same ``overrides`` the training gets) or nothing was trained before: training
    starts cold. Whether the weights fit the architecture is the training's decision.
    """
    config = load_training_config(overrides)
    if not config["warm_start"]["enabled"]:
        return None
    import mlflow
    from mlflow.tracking import MlflowClient

    reference = reference_release(lake)
    if reference is not None and reference.get("model_uri"):
        uri = str(reference["model_uri"])
        source = f"{uri} (model version {reference['version']}, {reference['source']})"
    else:
        name = str(config["mlflow"]["registered_model"])
        client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        versions = client.search_model_versions(f"name = '{name}'")
        if not versions:
            return None
        latest = max(versions, key=lambda found: int(found.version))
        uri = f"models:/{name}/{latest.version}"
        source = f"{uri} (model version {latest.version}, latest trained, no release yet)"
    with mlflow_tracking_uri(tracking_uri):
        network = mlflow.pytorch.load_model(uri, map_location="cpu")
    return WarmStart(network.state_dict(), source)
