"""The ``aiinfra`` CLI through typer's runner, on a LocalLake under a temporary DAGSTER_HOME."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from aiinfra_pipelines.cli import app
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.writer import write_drive_log

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, list(args), catch_exceptions=False, terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(autouse=True)
def _isolated_home(dagster_home):
    return dagster_home


def test_fleet_drive_lands_a_batch_the_lake_commands_show():
    output = invoke(
        "fleet", "drive", "--vehicles", "1", "--episodes", "1", "--seed", "3", "--batch", "cli1"
    )
    landed = int(re.search(r"landed (\d+) log", output).group(1))
    assert landed >= 1 and "ingest-cli1" in output

    assert "ingest-cli1" in invoke("lake", "branches")
    listing = invoke("lake", "ls", "ingest-cli1", "logs/")
    assert listing.count(".mcap") == landed
    log = invoke("lake", "log", "ingest-cli1", "--limit", "1")
    assert "upload batch cli1" in log and "batch_id=cli1" in log
    diff = invoke("lake", "diff", "main", "ingest-cli1")
    assert diff.count("added") == landed


def test_upload_lands_files_from_disk_as_one_commit(tmp_path):
    paths = []
    for seed in range(2):
        path = tmp_path / f"log{seed}.mcap"
        write_drive_log(make_synthetic_log(seed=seed), path)
        paths.append(str(path))

    output = invoke("lake", "upload", *paths, "--batch", "disk")

    assert "landed 2 file(s) on ingest-disk" in output
    assert invoke("lake", "ls", "ingest-disk").count(".mcap") == 2


def test_status_on_an_empty_lake():
    output = invoke("status")
    assert "lake drive-data" in output and "quarantine: empty" in output


def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path):
    result = runner.invoke(app, ["lake", "upload", str(tmp_path / "missing.mcap")])
    assert result.exit_code != 0
    assert "does not exist" in result.output
