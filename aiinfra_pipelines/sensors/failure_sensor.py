"""``loop_failure_sensor``: every failed run of the loop, recorded where an operator looks.

A run-failure sensor sees each failed run of this code location once (Dagster keeps its
cursor); for each it publishes ``operations/failures/<run id>.json`` to main and reports an
observation on the ``loop_failures`` asset (group ``operations``), so the asset's page in the
UI lists what broke, when, in which step and why.
"""

import dagster as dg

from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.operations.failures import record_failure

from .settings import SensorSettings


@dg.run_failure_sensor(
    name="loop_failure_sensor",
    minimum_interval_seconds=SensorSettings.load().failure_interval_s,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Records every failed run (job, failed steps, errors) on the loop_failures "
    "asset and in operations/failures/ on main.",
)
def loop_failure_sensor(context: dg.RunFailureSensorContext, lake: VersionedLake) -> None:
    record, commit = record_failure(
        lake, context.instance, context.dagster_run, context.failure_event
    )
    steps = ", ".join(step["step_key"] for step in record["failed_steps"]) or "no step"
    context.log.warning(
        f"run {record['run_id']} ({record['job_name']}) failed in {steps}; recorded at "
        f"{commit[:12]}"
    )
