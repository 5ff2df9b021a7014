"""``aiinfra trace`` through typer's runner, on a lake state built under a temporary home."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aiinfra_pipelines.cli import app
from aiinfra_pipelines.fleet.vehicles import build_fleet
from aiinfra_pipelines.gate_rules import gate_rules
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.release.certificate import certify_candidate
from aiinfra_pipelines.release.cohorts import in_cohort
from aiinfra_pipelines.release.keys import ReleaseKeys
from aiinfra_pipelines_tests.support.release_lake import (
    publish_candidate,
    publish_dataset,
    set_production,
    set_rollout,
    tamper,
)

runner = CliRunner()
SALT = "trace-salt"


def run(*args: str):
    return runner.invoke(app, ["trace", *args], catch_exceptions=False, terminal_width=250)


@pytest.fixture
def lake(dagster_home, monkeypatch) -> LocalLake:
    """The lake the CLI opens (local environment, under the temporary DAGSTER_HOME)."""
    monkeypatch.delenv("AIINFRA_ENV", raising=False)
    monkeypatch.setenv("COLUMNS", "250")  # the CLI's rich console: one table row per line
    for variable in ("AIINFRA_CERT_SIGNING_KEY", "AIINFRA_CERT_PUBLIC_KEY"):
        monkeypatch.delenv(variable, raising=False)
    lake = LocalLake()
    lake.ensure_repository()
    return lake


def raw_log_commits(lake: LocalLake) -> list[str]:
    """Two upload commits on an ingest branch: the raw-log commits a dataset came from."""
    lake.create_branch("ingest-b1")
    commits = []
    for index in range(2):
        lake.put_object("ingest-b1", f"logs/log-{index}.mcap", f"raw {index}".encode())
        commits.append(lake.commit("ingest-b1", f"upload {index}"))
    return commits


@pytest.fixture
def released(lake) -> dict:
    """Model 1 in production, model 2 rolling out to 50 %, both certified with the dev key."""
    keys = ReleaseKeys()  # dev key under DAGSTER_HOME, which the CLI finds for verification
    sources = raw_log_commits(lake)
    dataset_commit, _ = publish_dataset(lake, "dataset-v0001", sources)
    production = publish_candidate(lake, "1", seed=1, dataset_commit=dataset_commit)
    candidate = publish_candidate(lake, "2", seed=2, dataset_commit=dataset_commit)
    for version in ("1", "2"):
        certify_candidate(lake, version, keys.certificate_signer(), root_run_id=f"c{version}")
    set_production(lake, production)
    set_rollout(lake, candidate, status="in_progress", cohort_percent=50.0, salt=SALT)
    return {
        "sources": sources,
        "dataset_commit": dataset_commit,
        "production": production,
        "candidate": candidate,
    }


def test_trace_a_model_version_to_its_data_and_reports(released):
    result = run("1")

    assert result.exit_code == 0, result.output
    out = result.output
    assert "model version 1 — production" in out
    assert f"dataset-v0001 at commit {released['dataset_commit']}" in out
    for commit in released["sources"]:
        assert commit in out
    assert "valid (signed by key" in out
    for gate in ("offline_eval", "engine_parity", "engine_benchmark", "regression_simulation"):
        assert gate in out
    assert out.count(" pass ") >= 4
    assert released["production"]["ship"]["sha256"] in out
    # Which rules certified it, and the error rates they state.
    rules = gate_rules()
    flat = " ".join(out.split())
    assert f"gates.yaml {rules.version} sha256" in flat
    assert "calibration (simulation)" in flat and "aa_certified" in flat


def test_trace_an_engine_hash_prefix_to_its_model(released):
    engine_sha = released["candidate"]["ship"]["sha256"]

    result = run(engine_sha[:12])

    assert result.exit_code == 0, result.output
    assert "model version 2 — rollout in_progress at 50.0%" in result.output
    assert "shipped engine (int8, cpu-onnxruntime)" in result.output
    assert "model version 1" not in result.output


def test_trace_vins_inside_and_outside_the_cohort(released):
    fleet = build_fleet(12)
    inside = next(car for car in fleet if in_cohort(car.vin, 50.0, SALT))
    outside = next(car for car in fleet if not in_cohort(car.vin, 50.0, SALT))

    result = run(inside.vin)
    assert result.exit_code == 0, result.output
    assert f"VIN {inside.vin} ({inside.model}) runs candidate model version 2" in result.output
    assert "in the 50% cohort of rollout 2" in result.output
    assert released["sources"][0] in result.output

    result = run(outside.vin)
    assert result.exit_code == 0, result.output
    assert f"VIN {outside.vin} ({outside.model}) runs production model version 1" in result.output
    assert "outside the 50% cohort of rollout 2" in result.output


def test_a_tampered_report_shows_as_an_invalid_certificate(released, lake):
    key = released["production"]["reports"]["offline_eval"]["key"]
    forged = json.loads(lake.get_object("main", key)) | {"passed": True, "edited": 1}
    tamper(lake, key, json.dumps(forged).encode())

    result = run("1")

    assert result.exit_code == 0, result.output
    assert "INVALID" in result.output and "offline_eval" in result.output


def test_a_vin_before_any_release_runs_model_zero(lake):
    car = build_fleet(1)[0]

    result = run(car.vin)

    assert result.exit_code == 0, result.output
    assert "runs bootstrap model version bootstrap-0" in result.output


def test_an_argument_that_matches_nothing_is_a_clear_error(released):
    for query in ("deadbeefdeadbeef", "99", "not-a-thing"):
        result = run(query)
        assert result.exit_code == 2  # bad input: one line, exit 2 (cli_errors)
        assert f"nothing on main matches '{query}'" in result.output
        assert len(result.output.strip().splitlines()) == 1
