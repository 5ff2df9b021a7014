"""A reconstructable job that materializes ``trained_model`` (step re-execution needs one).

The lake, the MLflow store and the checkpoint root are the test's, named by environment
variables resolved when a run starts (Dagster caches a reconstructed job per process), so the
killed child process and the parent's re-execution train into the same places.
"""

from __future__ import annotations

import dagster as dg

from aiinfra_pipelines.lake.io_manager import LakeIOManager
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.training.definitions import defs as training_defs
from aiinfra_pipelines.training.resources import MlflowTracking

JOB_NAME = "train_job"
LAKE_ROOT_ENV = "AIINFRA_TEST_LAKE_ROOT"
TRACKING_URI_ENV = "AIINFRA_TEST_MLFLOW_TRACKING_URI"
CHECKPOINT_ROOT_ENV = "AIINFRA_TEST_CHECKPOINT_ROOT"


def get_job() -> dg.JobDefinition:
    lake = LocalLake(root=dg.EnvVar(LAKE_ROOT_ENV))
    job = dg.define_asset_job(
        JOB_NAME,
        selection=dg.AssetSelection.groups("training"),
        executor_def=dg.in_process_executor,
    )
    defs = dg.Definitions(
        assets=list(training_defs.assets),
        jobs=[job],
        resources={
            "lake": lake,
            "io_manager": LakeIOManager(lake=lake),
            "mlflow_tracking": MlflowTracking(
                tracking_uri=dg.EnvVar(TRACKING_URI_ENV),
                checkpoint_root=dg.EnvVar(CHECKPOINT_ROOT_ENV),
            ),
        },
    )
    return defs.resolve_job_def(JOB_NAME)
