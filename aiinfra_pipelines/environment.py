"""The deployment environment (``AIINFRA_ENV``: local, ci, prod) and the resources it selects.

Only configuration differs between a laptop and the cluster: the same code location loads
everywhere, and building prod resources never contacts a server (secrets resolve from
``dg.EnvVar`` at run time).
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg

from aiinfra_pipelines.config import load_resource_yaml

ENVIRONMENTS = ("local", "ci", "prod")


def environment_name() -> str:
    name = os.environ.get("AIINFRA_ENV", "local")
    if name not in ENVIRONMENTS:
        raise ValueError(f"AIINFRA_ENV={name!r}: expected one of {', '.join(ENVIRONMENTS)}")
    return name


def load_environment(name: str | None = None) -> dict[str, Any]:
    return load_resource_yaml(f"environments/{name or environment_name()}.yaml")


def build_lake(settings: dict[str, Any]):
    """The lake adapter the environment names."""
    lake_settings = settings["lake"]
    adapter = lake_settings["adapter"]
    if adapter == "local":
        from aiinfra_pipelines.lake.local import LocalLake

        return LocalLake(repository=lake_settings["repository"], root=lake_settings.get("root", ""))
    if adapter == "lakefs":
        from aiinfra_pipelines.lake.lakefs import LakeFSLake

        return LakeFSLake.from_settings(lake_settings)  # secrets as dg.EnvVar, nothing contacted
    raise ValueError(f"unknown lake adapter {adapter!r} (expected 'local' or 'lakefs')")


def build_resources(name: str | None = None) -> dict[str, Any]:
    """Resources for one environment, keyed as the assets and sensors expect them."""
    from aiinfra_pipelines.ingest.resources import AnonymizationKey
    from aiinfra_pipelines.lake.io_manager import LakeIOManager
    from aiinfra_pipelines.release.keys import release_keys_for_environment
    from aiinfra_pipelines.training.resources import MlflowTracking

    settings = load_environment(name)
    lake = build_lake(settings)
    key_required = bool(settings.get("anonymization", {}).get("key_from_env"))
    anonymization = (
        AnonymizationKey(key_hex=dg.EnvVar("AIINFRA_ANON_KEY"), require_key=key_required)
        if key_required or os.environ.get("AIINFRA_ANON_KEY")
        else AnonymizationKey()
    )
    mlflow_settings = settings.get("mlflow", {})
    tracking_uri = (
        dg.EnvVar("MLFLOW_TRACKING_URI")
        if mlflow_settings.get("tracking_uri_from_env") or os.environ.get("MLFLOW_TRACKING_URI")
        else ""
    )
    return {
        "lake": lake,
        "io_manager": LakeIOManager(lake=lake),
        "anonymization": anonymization,
        "mlflow_tracking": MlflowTracking(
            tracking_uri=tracking_uri,
            experiment=mlflow_settings.get("experiment", "perception"),
            checkpoint_root=mlflow_settings.get("checkpoint_root", ""),
            artifact_location=mlflow_settings.get("artifact_location", ""),
        ),
        # Signing keys from dg.EnvVar in prod (release.keys_from_env, default: prod only);
        # elsewhere dev keys generated under DAGSTER_HOME unless the variables are set.
        "release_keys": release_keys_for_environment(
            bool(
                (settings.get("release") or {}).get(
                    "keys_from_env", (name or environment_name()) == "prod"
                )
            )
        ),
    }
