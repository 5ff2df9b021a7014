"""Offline evaluation refuses an empty benchmark with a clear reason (it would prove nothing)."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines_tests.support.camera import CAMERA_SIZE
from aiinfra_pipelines_tests.support.loop_runs import (
    all_assets_and_checks,
    ingest_and_mine,
    loop_resources,
)


def test_a_benchmark_without_frames_fails_offline_eval_naming_why(tmp_path, instance):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    resources = loop_resources(lake, tmp_path)
    # One log per slice: each slice's only log goes to training, nothing is held out.
    ingest_and_mine(
        instance,
        resources,
        "single",
        [make_synthetic_log(n_frames=8, seed=1, **CAMERA_SIZE)],
    )
    assert dg.materialize(
        all_assets_and_checks(),
        selection=dg.AssetSelection.assets("benchmark_set"),
        instance=instance,
        resources=resources,
    ).success
    # The candidate as trained_model would have stored it (never loaded: the check comes first).
    candidate = {"model_uri": "models:/m-none", "mlflow_run_id": "none"}
    publish_objects(
        lake,
        "test-model",
        {"data/trained_model/__all__.json": json.dumps(candidate).encode()},
        "a trained_model record",
        {"kind": "test"},
    )

    with pytest.raises(ValueError, match="holds no frames"):
        dg.materialize(
            all_assets_and_checks(),
            selection=dg.AssetSelection.assets("offline_eval"),
            instance=instance,
            resources=resources,
        )
