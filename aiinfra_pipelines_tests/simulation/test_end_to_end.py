"""Slow: a real fleet drive through ingestion and mining, then the sensor-driven regression
cycle with two worker processes — every mined log becomes a scenario both engines drive."""

from __future__ import annotations

import dagster as dg
import pytest

from aiinfra_pipelines.fleet.settings import with_overrides
from aiinfra_pipelines.fleet.simulator import drive_fleet
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.io_manager import read_asset_partitions
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.sensors.simulation_sensor import regression_simulation_sensor
from aiinfra_pipelines.simulation.candidate import report_key
from aiinfra_pipelines.simulation.library import LIBRARY_KEY
from aiinfra_pipelines.simulation.scenarios import derived_seed
from aiinfra_pipelines_tests.support.loop_runs import ingest_and_mine, loop_resources
from aiinfra_pipelines_tests.support.simulation_engines import perception_net_onnx
from aiinfra_pipelines_tests.support.simulation_lake import (
    launch,
    new_mlflow_run,
    publish_candidate,
)

from .conftest import write_test_resources

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_fleet_logs_to_regression_report(tmp_path, monkeypatch, instance):
    monkeypatch.setenv("AIINFRA_RESOURCES", str(write_test_resources(tmp_path, workers=2)))
    short = {"max_duration_s": 4}
    config = with_overrides(
        None,
        {"simulation": {"road_types": {name: short for name in ("highway", "merge")}}},
    )
    logs = drive_fleet(2, 1, seed=4, config=config)
    assert logs
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    resources = loop_resources(lake, tmp_path)
    ingest_and_mine(instance, resources, "e2e", logs)
    mined = set(read_asset_partitions(lake, "mined_badcases", MAIN_BRANCH)["log_id"])
    assert mined  # model zero finds every frame hard

    run_id = new_mlflow_run(resources["mlflow_tracking"].uri(), tmp_path / "mlruns")
    publish_candidate(lake, "1", perception_net_onnx(seed=5), run_id)
    cycle = {"instance": instance, "resources": resources}
    for _ in range(4):
        context = dg.build_sensor_context(instance=instance, resources={"lake": lake})
        result = regression_simulation_sensor(context)
        if isinstance(result, dg.SkipReason):
            break
        for request in result.run_requests:
            assert launch(cycle, request).success
    assert "already has regression results" in result.skip_message

    library = lake.get_json(MAIN_BRANCH, LIBRARY_KEY)
    ids = {entry["id"] for entry in library["scenarios"]}
    assert {f"log-{log_id}" for log_id in mined} <= ids
    index = scene_index_view(lake)
    commits = dict(zip(index["log_id"], index["source_commit"], strict=False))
    contents = dict(zip(index["log_id"], index["log_sha256"], strict=False))
    for entry in library["scenarios"]:
        if entry["kind"] != "base":
            log_id = entry["source"]["log_id"]
            assert entry["source"]["source_commit"] == commits[log_id]
            # Its seed rests on the log's bytes as the car recorded them, not on the commit.
            assert len(contents[log_id]) == 64
            assert entry["source"]["log_sha256"] == contents[log_id]
            assert entry["seed"] == derived_seed(log_id, contents[log_id])
    report = lake.get_json(MAIN_BRANCH, report_key("1"))
    assert {row["scenario_id"] for row in report["scenarios"]} == ids
    assert report["model_version"] == "1"
    # Nothing released: production is model zero, so the first release is judged against the
    # oracle. The untrained candidate falls back on every frame as model zero does and causes
    # no collision (as in test_regression_cycle.py): certified, with nothing against it.
    assert report["aggregate"]["first_release"] is True
    assert report["passed"] is True and report["failures"] == [], report["aggregate"]
    assert report["summary"]["candidate_at_fault"] == 0, report["summary"]
