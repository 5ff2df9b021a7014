"""``regression_simulation_sensor`` when nothing is to do, and when a stage's run failed: it
names the cause and does not re-launch (the failed scenario library stays the operator's)."""

from __future__ import annotations

import dagster as dg
import pytest

from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.sensors.simulation_sensor import regression_simulation_sensor
from aiinfra_pipelines.simulation.library import LIBRARY_KEY
from aiinfra_pipelines_tests.support.simulation_engines import reckless_onnx
from aiinfra_pipelines_tests.support.simulation_lake import (
    launch,
    publish_candidate,
    simulation_resources,
)

from .conftest import write_test_resources

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def broken_resources(tmp_path, monkeypatch):
    folder = write_test_resources(tmp_path)
    (folder / "scenarios" / "typo.yaml").write_text(
        "family: typo\nscenario: {road_type: highway, weather: sunny, lighting: day}\n"
    )
    monkeypatch.setenv("AIINFRA_RESOURCES", str(folder))
    return folder


def evaluate(instance, lake):
    context = dg.build_sensor_context(instance=instance, resources={"lake": lake})
    return regression_simulation_sensor(context)


def test_no_candidate_no_runs(instance, local_lake):
    result = evaluate(instance, local_lake)
    assert isinstance(result, dg.SkipReason)
    assert "no candidate published yet" in result.skip_message


def test_a_failed_stage_is_reported_not_relaunched(broken_resources, instance, tmp_path):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    publish_candidate(lake, "5", reckless_onnx(), mlflow_run_id="unused")
    cycle = {"instance": instance, "resources": simulation_resources(lake, "sqlite://")}
    result = evaluate(instance, lake)
    [request] = result.run_requests
    assert request.run_key == "library-5" and request.tags["aiinfra/model_version"] == "5"
    run = launch(cycle, request, raise_on_error=False)
    assert not run.success
    failure = next(e for e in run.all_events if e.event_type_value == "STEP_FAILURE")
    cause = failure.step_failure_data.error.cause
    assert "typo.yaml [typo]: weather 'sunny' is not one of" in cause.message
    assert not lake.object_exists(MAIN_BRANCH, LIBRARY_KEY)  # nothing half-published
    again = evaluate(instance, lake)
    assert isinstance(again, dg.SkipReason)
    assert "run library-5 failure; re-execute it" in again.skip_message
