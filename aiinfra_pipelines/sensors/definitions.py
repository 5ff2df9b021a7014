"""The sensors' Dagster definitions, and the jobs they and operators launch."""

import dagster as dg

from aiinfra_pipelines.environment import load_environment
from aiinfra_pipelines.runs import RESOURCE_TAG

from .failure_sensor import loop_failure_sensor
from .ingest_sensor import lakefs_ingest_sensor
from .retrain_sensor import retraining_sensor
from .rollout_sensor import rollout_sensor, telemetry_sensor
from .simulation_sensor import (
    regression_report_job,
    regression_shard_job,
    regression_simulation_sensor,
    scenario_library_job,
)

# Mining follows ingestion through automation conditions (eager on each published log), and
# the frame similarity index follows mining's publishes.
loop_automation_sensor = dg.AutomationConditionSensorDefinition(
    "loop_automation_sensor",
    target=dg.AssetSelection.groups("mining") | dg.AssetSelection.assets("similarity_index"),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=int(load_environment()["automation"]["interval_s"]),
)

# Dataset → training → evaluation → deployment as one run: the dataset commit, the model, its
# verdict and its engines belong together. Launched by operators (UI / CLI) and the retraining
# sensor.
training_cycle_job = dg.define_asset_job(
    "training_cycle",
    selection=dg.AssetSelection.groups("datasets", "training", "evaluation", "deployment"),
    tags={RESOURCE_TAG: "gpu"},
)

defs = dg.Definitions(
    sensors=[
        lakefs_ingest_sensor,
        loop_automation_sensor,
        retraining_sensor,
        regression_simulation_sensor,
        telemetry_sensor,
        rollout_sensor,
        loop_failure_sensor,
    ],
    jobs=[training_cycle_job, scenario_library_job, regression_shard_job, regression_report_job],
)
