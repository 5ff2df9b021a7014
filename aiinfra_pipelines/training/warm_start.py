"""Which weights a retraining starts from: the reference release's, else the last model trained.

Each cycle adds data; training every candidate from scratch on all of it grows the cost with
the fleet's history. Starting from the newest release (what the fleet runs or is moving to)
keeps what earlier cycles learned and fine-tunes on everything published. Before the first
release, the previous cycle's candidate (registered, even if a gate refused it: it learned
from a subset of today's data) is the best starting point there is; only the very first
training starts cold.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.perception.network import PerceptionNet

from .resources import load_registered_network
from .settings import load_training_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmStart:
    """Weights to start from instead of a random initialization: a released model's.

    ``source`` names them (an MLflow model URI and version) and is recorded as the run's
    ``warm_start_from`` param, so a model's lineage includes the model it grew from.
    """

    state_dict: Mapping[str, torch.Tensor]
    source: str


def warm_start_settings(settings: dict[str, Any], explicit_max_epochs: bool) -> dict[str, Any]:
    """``training.yaml`` ``warm_start``: fewer epochs at a scaled learning rate."""
    section = settings["warm_start"]
    optimizer = {**settings["optimizer"]}
    optimizer["lr"] = float(optimizer["lr"]) * float(section["lr_scale"])
    updated = {**settings, "optimizer": optimizer}
    if not explicit_max_epochs:
        updated["max_epochs"] = int(section["max_epochs"])
    return updated


def fits(network: PerceptionNet, warm_start: WarmStart) -> bool:
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
    # Here, not at the top: the training entry point imports WarmStart from this module and
    # must not pull in the release layer (nor its lake code) to train.
    from aiinfra_pipelines.release.reference import reference_release

    reference = reference_release(lake)
    if reference is None or not reference.get("model_uri"):
        name = str(config["mlflow"]["registered_model"])
        return latest_registered_warm_start(tracking_uri, name, "latest trained, no release yet")
    uri = str(reference["model_uri"])
    source = f"{uri} (model version {reference['version']}, {reference['source']})"
    return WarmStart(load_registered_network(uri, tracking_uri).state_dict(), source)


def latest_registered_warm_start(
    tracking_uri: str, registered_model: str, why: str = "latest trained"
) -> WarmStart | None:
    """The newest registered version of ``registered_model``'s weights, or ``None``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    versions = client.search_model_versions(f"name = '{registered_model}'")
    if not versions:
        return None
    latest = max(versions, key=lambda found: int(found.version))
    uri = f"models:/{registered_model}/{latest.version}"
    network = load_registered_network(uri, tracking_uri)
    return WarmStart(network.state_dict(), f"{uri} (model version {latest.version}, {why})")
