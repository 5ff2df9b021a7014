"""The sensors' Dagster definitions, and the jobs they and operators launch."""

import dagster as dg

from aiinfra_pipelines.environment import load_environment

from .ingest_sensor import lakefs_ingest_sensor

# Mining follows ingestion through automation conditions (eager on each published log).
loop_automation_sensor = dg.AutomationConditionSensorDefinition(
    "loop_automation_sensor",
    target=dg.AssetSelection.groups("mining"),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=int(load_environment()["automation"]["interval_s"]),
)

# Dataset → training → evaluation as one run: the dataset commit, the model and its verdict
# belong together. Launched by operators (UI / CLI) now, by the retraining sensor later.
training_cycle_job = dg.define_asset_job(
    "training_cycle",
    selection=dg.AssetSelection.groups("datasets", "training", "evaluation"),
    tags={"aiinfra/resource": "gpu"},
)

defs = dg.Definitions(
    sensors=[lakefs_ingest_sensor, loop_automation_sensor], jobs=[training_cycle_job]
)
