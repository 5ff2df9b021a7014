"""The code location loads in every environment and shows the groups, checks and sensors."""

from __future__ import annotations

import subprocess
import sys

import dagster as dg
import pytest

from aiinfra_pipelines.config import PROJECT_ROOT
from aiinfra_pipelines.definitions import build_definitions

INGEST_ASSETS = {
    "drive_logs",
    "validated_drive_logs",
    "anonymized_frames",
    "scene_index",
    "published_ingest",
}


@pytest.mark.parametrize("environment", ["local", "ci", "prod"])
def test_definitions_load_in_every_environment(environment, monkeypatch, tmp_path):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    for secret in (
        "LAKEFS_ENDPOINT",
        "LAKEFS_ACCESS_KEY_ID",
        "LAKEFS_SECRET_ACCESS_KEY",
        "AIINFRA_ANON_KEY",
    ):
        monkeypatch.delenv(secret, raising=False)  # prod must load without any server or secret

    defs = build_definitions(environment)
    dg.Definitions.validate_loadable(defs)

    graph = defs.resolve_asset_graph()
    ingest = {
        key.to_user_string()
        for key in graph.get_all_asset_keys()
        if graph.get(key).group_name == "ingest"
    }
    assert ingest == INGEST_ASSETS
    check_names = {key.name for key in graph.asset_check_keys}
    assert "anonymized_frames_have_no_pii" in check_names
    assert {
        "gx_scene_index_schema",
        "gx_scene_index_ranges",
        "gx_scene_index_nulls",
        "gx_scene_index_categories",
    } <= check_names
    groups = {graph.get(key).group_name for key in graph.get_all_asset_keys()}
    assert {
        "ingest",
        "mining",
        "datasets",
        "training",
        "evaluation",
        "deployment",
        "simulation",
        "release",
        "operations",
    } <= groups
    assert {
        "offline_eval_no_slice_regression",
        "engine_parity_within_budget",
        "engine_benchmark_within_latency_budget",
        "regression_no_new_failures",
        "certificate_valid",
    } <= check_names
    assert {sensor.name for sensor in defs.sensors} == {
        "lakefs_ingest_sensor",
        "loop_automation_sensor",
        "retraining_sensor",
        "regression_simulation_sensor",
        "telemetry_sensor",
        "rollout_sensor",
        "loop_failure_sensor",
    }
    assert defs.resolve_job_def("training_cycle") is not None


def test_prod_selects_lakefs_with_secrets_as_env_vars(monkeypatch, tmp_path):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    resources = build_definitions("prod").resources
    assert type(resources["lake"]).__name__ == "LakeFSLake"
    assert isinstance(resources["lake"].secret_access_key, dg.EnvVar)
    assert isinstance(resources["anonymization"].key_hex, dg.EnvVar)


def test_unknown_environment_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("AIINFRA_ENV", "staging")
    with pytest.raises(ValueError, match="AIINFRA_ENV='staging'"):
        build_definitions()


def test_workspace_loads_with_the_dagster_cli(tmp_path):
    """What `dagster dev -w workspace.yaml` loads: one code location, no loading errors."""
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        capture_output=True,
        text=True,
        env={"DAGSTER_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        cwd=PROJECT_ROOT,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
