"""The run-failure sensor: a failed run shows on ``loop_failures`` and lands on main."""

from __future__ import annotations

import dagster as dg

from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.operations.definitions import defs as operations_defs
from aiinfra_pipelines.operations.failures import LOOP_FAILURES, failure_record_key
from aiinfra_pipelines.sensors.failure_sensor import loop_failure_sensor

batches = dg.StaticPartitionsDefinition(["b1"])


@dg.asset(partitions_def=batches, group_name="ingest")
def flaky_upload() -> int:
    raise ValueError("checksum mismatch in logs/x.mcap")


def run_failure(instance) -> dg.ExecuteInProcessResult:
    result = dg.materialize(
        [flaky_upload],
        instance=instance,
        partition_key="b1",
        raise_on_error=False,
        tags={"aiinfra/group": "ingest"},
    )
    assert not result.success
    return result


def evaluate(instance, lake, result) -> None:
    context = dg.build_run_status_sensor_context(
        sensor_name="loop_failure_sensor",
        dagster_event=result.get_run_failure_event(),
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        resources={"lake": lake},
    )
    loop_failure_sensor(context)


def test_a_failed_run_is_recorded_on_the_lake_and_observed_in_the_ui(instance, local_lake):
    result = run_failure(instance)
    evaluate(instance, local_lake, result)
    record = local_lake.get_json(MAIN_BRANCH, failure_record_key(result.run_id))
    assert record["run_id"] == result.run_id and record["partition"] == "b1"
    assert record["assets"] == ["flaky_upload"]
    assert record["tags"] == {"aiinfra/group": "ingest"}
    (step,) = record["failed_steps"]
    assert step["step_key"] == "flaky_upload"
    assert "checksum mismatch in logs/x.mcap" in step["error"]
    observations = instance.fetch_observations(LOOP_FAILURES, limit=10).records
    assert len(observations) == 1
    metadata = observations[0].asset_observation.metadata
    assert metadata["run_id"].value == result.run_id
    assert "flaky_upload" in metadata["failed_steps"].value
    assert metadata["lake_record"].value.endswith(failure_record_key(result.run_id))


def test_the_record_is_the_same_however_often_it_is_built(instance, local_lake):
    result = run_failure(instance)
    evaluate(instance, local_lake, result)
    first = local_lake.get_object(MAIN_BRANCH, failure_record_key(result.run_id))
    evaluate(instance, local_lake, result)
    assert local_lake.get_object(MAIN_BRANCH, failure_record_key(result.run_id)) == first


def test_loop_failures_is_an_operations_asset_the_ui_lists():
    specs = [a for a in operations_defs.assets if isinstance(a, dg.AssetSpec)]
    assert [(s.key, s.group_name) for s in specs] == [(LOOP_FAILURES, "operations")]
