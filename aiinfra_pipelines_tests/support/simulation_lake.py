"""A small published lake state for simulation tests, built with the real table functions.

``publish_fleet_tables`` puts what ingestion and mining publish on ``main`` — scene-index rows
(every log tag, per-frame event flags, source commit) and mined badcases — for synthetic drive
logs, using ``ingest.tables`` and ``mining.rules`` themselves, so the column contract is the
real one without driving highway-env. ``publish_candidate`` writes what the deployment layer
publishes (docs/loop.md): the ship engine, the manifest and ``candidates/latest.json``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import numpy as np

from aiinfra_pipelines.ingest.tables import frames_table, scene_index_table, trigger_rule_names
from aiinfra_pipelines.lake.io_manager import LakeIOManager, asset_object_base, parquet_bytes
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.mining.rules import mine_badcases
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.engine import Predictions
from aiinfra_pipelines.simulation import definitions as simulation_layer
from aiinfra_pipelines.training.resources import MlflowTracking

KEY = b"k" * 32


@dataclass(frozen=True)
class LogSpec:
    log_id: str
    road_type: str = "highway"
    weather: str = "clear"
    lighting: str = "day"
    badcase: bool = True
    near_collision_frame: int | None = None


def fleet_tables(spec: LogSpec, seed: int, source_commit: str):
    """(scene index rows, mined badcase rows) of one synthetic log."""
    log = make_synthetic_log(
        n_frames=10,
        seed=seed,
        log_id=spec.log_id,
        road_type=spec.road_type,
        weather=spec.weather,
        lighting=spec.lighting,
    )
    frames = frames_table(anonymize_log(log, KEY))
    events = []
    if spec.near_collision_frame is not None:
        events.append(
            (int(frames["timestamp_ns"].iloc[spec.near_collision_frame]), "near_collision")
        )
    tags = {**log.metadata, "vehicle_pseudonym": frames["vehicle_pseudonym"].iloc[0]}
    index = scene_index_table(
        frames,
        tags=tags,
        events=events,
        rule_names=trigger_rule_names(),
        source_branch="ingest-test",
        source_commit=source_commit,
        log_key=f"logs/{spec.log_id}.mcap",
        frames_object=f"data/anonymized_frames/{spec.log_id}.parquet",
    )
    n, bins = len(frames), perception_spec().bins
    confidence = np.full(n, 0.1 if spec.badcase else 0.99, dtype=np.float32)
    predictions = Predictions(
        occupancy=np.full((n, 3, bins), 0.0, dtype=np.float32),
        lead_gap_m=np.full(n, 75.0, dtype=np.float32),
        confidence=confidence,
    )
    badcases = mine_badcases(frames, index, predictions, None)
    badcases = badcases.assign(engine_version="1", engine_sha="0" * 64)  # a released engine
    return index, badcases


def publish_fleet_tables(lake: LocalLake, specs: list[LogSpec], run_id: str) -> str:
    """Publish scene-index and badcase partitions for ``specs`` to ``main``; the merge commit."""
    commit = lake.resolve_ref(MAIN_BRANCH)
    objects = {}
    for seed, spec in enumerate(specs):
        index, badcases = fleet_tables(spec, seed, commit)
        partition = f"test/{spec.log_id}"
        objects[asset_object_base(dg.AssetKey("scene_index"), partition) + ".parquet"] = (
            parquet_bytes(index)
        )
        objects[asset_object_base(dg.AssetKey("mined_badcases"), partition) + ".parquet"] = (
            parquet_bytes(badcases)
        )
    return publish_objects(lake, run_id, objects, "test fleet tables", {"kind": "test"})


def new_mlflow_run(tracking_uri: str, artifacts: Path) -> str:
    """A run in an experiment whose artifacts live under ``artifacts`` (never the cwd)."""
    import mlflow

    from aiinfra_pipelines.training.resources import mlflow_tracking_uri

    with mlflow_tracking_uri(tracking_uri):
        client = mlflow.MlflowClient()
        experiment = client.get_experiment_by_name("sim-tests")
        experiment_id = (
            experiment.experiment_id
            if experiment
            else client.create_experiment("sim-tests", artifact_location=artifacts.as_uri())
        )
        return client.create_run(experiment_id).info.run_id


def publish_candidate(
    lake: LocalLake, model_version: str, onnx_bytes: bytes, mlflow_run_id: str
) -> dict:
    """The deployment layer's output for one candidate (manifest per docs/loop.md)."""
    digest = hashlib.sha256(onnx_bytes).hexdigest()
    ship_key = f"candidates/{model_version}/int8.onnx"
    manifest = {
        "model_version": model_version,
        "registered_model": "perception",
        "mlflow_run_id": mlflow_run_id,
        "engines": {"int8": {"key": ship_key, "sha256": digest, "bytes": len(onnx_bytes)}},
        "ship": {
            "precision": "int8",
            "key": ship_key,
            "sha256": digest,
            "target": "cpu-onnxruntime",
        },
        "reports": {},
    }
    publish_objects(
        lake,
        f"candidate-{model_version}",
        {
            ship_key: onnx_bytes,
            f"candidates/{model_version}/manifest.json": json.dumps(manifest).encode(),
            "candidates/latest.json": json.dumps({"model_version": model_version}).encode(),
        },
        f"candidate {model_version}",
        {"kind": "published_engine", "model_version": model_version},
    )
    return manifest


def simulation_resources(lake: LocalLake, tracking_uri: str) -> dict:
    return {
        "lake": lake,
        "io_manager": LakeIOManager(lake=lake),
        "mlflow_tracking": MlflowTracking(tracking_uri=tracking_uri),
    }


SIMULATION_ASSETS = [*simulation_layer.defs.assets, *simulation_layer.defs.asset_checks]


def materialize(
    instance: dg.DagsterInstance,
    resources: dict,
    selection: str,
    *,
    partition_key: str | None = None,
    model_version: str = "",
    tags: dict | None = None,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    """Materialize one simulation asset (its checks included) as its run would."""
    run_config = (
        {"ops": {selection: {"config": {"model_version": model_version}}}}
        if selection != "scenario_library"
        else None
    )
    return dg.materialize(
        SIMULATION_ASSETS,
        selection=dg.AssetSelection.assets(selection),
        instance=instance,
        resources=resources,
        partition_key=partition_key,
        run_config=run_config,
        tags=tags,
        raise_on_error=raise_on_error,
    )


JOB_ASSETS = {
    "scenario_library_refresh": "scenario_library",
    "regression_simulation_shard": "regression_simulation",
    "regression_report_run": "regression_report",
}


def _simulation_ops_only(run_config: dict | None) -> dict | None:
    """The request's config for this layer's assets only: the report run also certifies, which
    needs the release layer and a fully published candidate (tested in ``release`` and ``e2e``)."""
    if not run_config:
        return None
    ops = {
        name: op for name, op in run_config.get("ops", {}).items() if name in JOB_ASSETS.values()
    }
    return {**run_config, "ops": ops}


def launch(
    cycle: dict, request: dg.RunRequest, raise_on_error: bool = True
) -> dg.ExecuteInProcessResult:
    """Execute a sensor's run request as the daemon would: its job's assets, partition, run
    config and tags, plus the ``dagster/run_key`` tag Dagster stamps on sensor runs."""
    return dg.materialize(
        SIMULATION_ASSETS,
        selection=dg.AssetSelection.assets(JOB_ASSETS[request.job_name]),
        instance=cycle["instance"],
        resources=cycle["resources"],
        partition_key=request.partition_key,
        run_config=_simulation_ops_only(request.run_config),
        tags={**request.tags, "dagster/run_key": request.run_key},
        raise_on_error=raise_on_error,
    )
