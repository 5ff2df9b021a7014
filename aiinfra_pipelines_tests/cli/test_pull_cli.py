"""``aiinfra pull``: an operator asks the fleet for the raw logs of a slice, and follows it."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from aiinfra_pipelines.cli import app
from aiinfra_pipelines.environment import build_lake, load_environment
from aiinfra_pipelines.ingest.resources import AnonymizationKey
from aiinfra_pipelines.lake.io_manager import LakeIOManager
from aiinfra_pipelines.vehicle.fleet_upload import upload_through_outboxes
from aiinfra_pipelines_tests.support.ingest_runs import materialize_partition, partition_of
from aiinfra_pipelines_tests.vehicle.test_index_only_pulls import encoded, quiet_night_sample

runner = CliRunner()


def _pull(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["pull", *args], terminal_width=200)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_pull_a_slice_then_list_the_requests(dagster_home, instance, tmp_path) -> None:
    lake = build_lake(load_environment())  # the lake the CLI opens
    lake.ensure_repository()
    sample = quiet_night_sample(8)
    sent = upload_through_outboxes(lake, [encoded(sample)], "cli-pull", root=tmp_path / "cars")
    resources = {
        "lake": lake,
        "io_manager": LakeIOManager(lake=lake),
        "anonymization": AnonymizationKey(key_hex="ab" * 32),
    }
    assert materialize_partition(instance, resources, partition_of(sent.batch)).success

    code, output = _pull("request", "--slice", "fog/rain/merge", "--reason", "x")
    assert code != 0 and "no indexed segment in slice" in output
    code, output = _pull("request", "--reason", "x")
    assert code != 0 and "name log ids or a --slice" in output

    code, output = _pull(
        "request", "--slice", "night/clear/highway", "--reason", "weak at night", "--json"
    )
    assert code == 0, output
    report = json.loads(output)
    assert report["requested"] == [sample.log_id] and report["request_id"].startswith("pull-")

    code, output = _pull("list", "--json")
    assert code == 0, output
    (request,) = json.loads(output)
    assert request["status"] == "open" and request["reason"] == "weak at night"
    assert request["slice"] == "night/clear/highway"
    code, table = _pull("list", "--status", "served")
    assert code == 0 and sample.log_id not in table
    status = runner.invoke(app, ["status"], terminal_width=200).output
    assert "held on cars (index only): 1 segment(s), 20 frame(s); pull requests: 1 open" in status
