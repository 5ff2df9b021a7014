"""A reconstructable ingest job (step re-execution needs one), on the lake the test names."""

from __future__ import annotations

import dagster as dg

from aiinfra_pipelines.ingest.checks import ingest_checks
from aiinfra_pipelines.ingest.definitions import defs as ingest_defs
from aiinfra_pipelines.ingest.resources import AnonymizationKey
from aiinfra_pipelines.lake.io_manager import LakeIOManager
from aiinfra_pipelines.lake.local import LocalLake

LAKE_ROOT_ENV = "AIINFRA_TEST_LAKE_ROOT"


def get_job() -> dg.JobDefinition:
    # Resolved when a run starts, not when the job is built: Dagster caches a reconstructed
    # job per process, and each test names its own lake.
    lake = LocalLake(root=dg.EnvVar(LAKE_ROOT_ENV))
    job = dg.define_asset_job(
        "ingest_job",
        selection=dg.AssetSelection.groups("ingest"),
        executor_def=dg.in_process_executor,
    )
    defs = dg.Definitions(
        assets=list(ingest_defs.assets),
        asset_checks=ingest_checks(),
        jobs=[job],
        resources={
            "lake": lake,
            "io_manager": LakeIOManager(lake=lake),
            "anonymization": AnonymizationKey(key_hex="ab" * 32),
        },
    )
    return defs.resolve_job_def("ingest_job")
