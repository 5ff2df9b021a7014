"""``regression_simulation_sensor``: every new candidate gets a closed-loop regression report.

When ``candidates/latest.json`` names a model version without a published
``reports/regression_simulation.json``, the sensor walks it through three stages, one tick at a
time, reading progress from ``main`` (so runs an operator launched by hand count too):

1. ``scenario_library`` refreshed for this candidate (run key ``library-<v>``), so the library
   holds every badcase and fleet failure mined before the candidate was simulated;
2. one ``regression_simulation`` run per shard partition (run key ``sim-<v>-<shard>``) for the
   shards whose published record is not yet for this candidate and library version;
3. once every shard is, ``regression_report`` (run key ``report-<v>``).

Run keys make a repeated tick harmless: the sensor skips keys that already have a run in the
instance, and Dagster itself never launches a run key twice for a sensor. A failed run is not
re-requested (same key): the skip reason names it, an operator re-executes it (or the
instance's run retries do). Each run carries the model version in its run config, so all
shards and the report of a cycle agree on the candidate even if a newer one is published
meanwhile — the sensor then moves on to the newest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.runs import MODEL_VERSION_TAG, SIMULATION_STAGE_TAG
from aiinfra_pipelines.simulation.assets import shard_partition_keys
from aiinfra_pipelines.simulation.candidate import latest_candidate_version, report_key
from aiinfra_pipelines.simulation.library import LIBRARY_KEY
from aiinfra_pipelines.simulation.results import shard_result_key

from .settings import SimulationSensorSettings

# What each stage materializes. Extend REPORT_SELECTION to run more assets with the report
# (e.g. ``| dg.AssetSelection.assets("certified_engine")``): the report job is built from it.
LIBRARY_SELECTION = dg.AssetSelection.assets("scenario_library")
SHARD_SELECTION = dg.AssetSelection.assets("regression_simulation")
# The report run ends with certification: every gate's verdict is known once the regression
# report is published, so the same run re-verifies them all and signs (or refuses) the candidate.
REPORT_SELECTION = dg.AssetSelection.assets("regression_report", "certified_engine")
# Assets of the report run whose config takes the candidate's ``model_version``.
REPORT_CONFIGURED_ASSETS = ["regression_report", "certified_engine"]

scenario_library_job = dg.define_asset_job("scenario_library_refresh", selection=LIBRARY_SELECTION)
regression_shard_job = dg.define_asset_job(
    "regression_simulation_shard", selection=SHARD_SELECTION
)  # partitioned by the shards (inferred from regression_simulation)
regression_report_job = dg.define_asset_job("regression_report_run", selection=REPORT_SELECTION)

RUN_KEY_TAG = "dagster/run_key"  # the tag Dagster puts on every run a sensor launched
FAILED = {dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def sensor_interval_s() -> int:
    return SimulationSensorSettings.load().interval_s


def regression_run_config(
    model_version: str, assets: Sequence[str], **pinned: str
) -> dict[str, Any]:
    """Run config pinning every simulation asset of a run to one candidate (and whatever else
    ``pinned`` names, e.g. a shard's ``library_commit``)."""
    return {
        "ops": {name: {"config": {"model_version": model_version, **pinned}} for name in assets}
    }


def _request(
    job: dg.UnresolvedAssetJobDefinition,
    run_key: str,
    model_version: str,
    stage: str,
    *,
    partition_key: str | None = None,
    run_config: dict[str, Any] | None = None,
) -> dg.RunRequest:
    return dg.RunRequest(
        job_name=job.name,
        run_key=run_key,
        partition_key=partition_key,
        run_config=run_config or {},
        tags={MODEL_VERSION_TAG: model_version, SIMULATION_STAGE_TAG: stage},
    )


def plan_regression_runs(
    lake: VersionedLake,
    shard_keys: Sequence[str],
    run_status: Callable[[str], dg.DagsterRunStatus | None],
) -> tuple[list[dg.RunRequest], str]:
    """The runs to request now and why (the sensor's whole logic, testable without a tick).

    ``run_status(run_key)`` is the status of the newest run with that key, ``None`` if none.
    """
    version = latest_candidate_version(lake)
    if version is None:
        return [], "no candidate published yet (candidates/latest.json)"
    if lake.object_exists(MAIN_BRANCH, report_key(version)):
        return [], f"candidate {version} already has regression results"

    library = lake.get_json_or_none(MAIN_BRANCH, LIBRARY_KEY)
    refreshed_for = ((library or {}).get("built_from") or {}).get("refreshed_for_model_version")
    if library is None or refreshed_for != version:
        key = f"library-{version}"
        return _once(
            key,
            run_status,
            lambda: _request(scenario_library_job, key, version, "library"),
            f"scenario library refresh for candidate {version}",
        )

    # The library the shards simulate, pinned by the commit it was read at: a shard run
    # that starts later still simulates what the sensor saw refreshed for this candidate.
    library_commit = lake.resolve_ref(MAIN_BRANCH)
    pending = [shard for shard in shard_keys if not _shard_done(lake, shard, version, library)]
    if pending:
        requests, waiting = [], []
        for shard in pending:
            key = f"sim-{version}-{shard}"
            status = run_status(key)
            if status is None:
                requests.append(
                    _request(
                        regression_shard_job,
                        key,
                        version,
                        "shard",
                        partition_key=shard,
                        run_config=regression_run_config(
                            version, ["regression_simulation"], library_commit=library_commit
                        ),
                    )
                )
            elif status in FAILED:
                waiting.append(f"{shard} (run {key} {status.value.lower()}: re-execute it)")
            elif status == dg.DagsterRunStatus.SUCCESS:
                # Its run key is spent but the shard is stale: the library changed after it ran.
                waiting.append(f"{shard} (ran for an older library version: re-execute {key})")
            else:
                waiting.append(f"{shard} ({status.value.lower()})")
        reason = f"candidate {version}: requesting {len(requests)} shard run(s)"
        if waiting:
            reason += f"; waiting for {', '.join(waiting)}"
        return requests, reason

    key = f"report-{version}"
    return _once(
        key,
        run_status,
        lambda: _request(
            regression_report_job,
            key,
            version,
            "report",
            run_config=regression_run_config(version, REPORT_CONFIGURED_ASSETS),
        ),
        f"all {len(shard_keys)} shard(s) simulated for candidate {version}: report",
    )


def _once(
    key: str,
    run_status: Callable[[str], dg.DagsterRunStatus | None],
    build: Callable[[], dg.RunRequest],
    what: str,
) -> tuple[list[dg.RunRequest], str]:
    status = run_status(key)
    if status is None:
        return [build()], f"requesting {what} ({key})"
    if status in FAILED:
        return [], f"{what}: run {key} {status.value.lower()}; re-execute it"
    return [], f"{what}: waiting for run {key} ({status.value.lower()})"


def _shard_done(lake: VersionedLake, shard: str, version: str, library: dict) -> bool:
    key = shard_result_key(shard)
    record = lake.get_json_or_none(MAIN_BRANCH, key)
    if record is None:
        return False
    return str(record.get("model_version")) == version and int(
        record.get("library_version", -1)
    ) == int(library["library_version"])


@dg.sensor(
    name="regression_simulation_sensor",
    jobs=[scenario_library_job, regression_shard_job, regression_report_job],
    minimum_interval_seconds=sensor_interval_s(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="New candidate → scenario library refresh → one run per shard → report.",
)
def regression_simulation_sensor(
    context: dg.SensorEvaluationContext, lake: VersionedLake
) -> dg.SensorResult | dg.SkipReason:
    def run_status(run_key: str) -> dg.DagsterRunStatus | None:
        runs = context.instance.get_runs(
            filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1
        )
        return runs[0].status if runs else None

    requests, reason = plan_regression_runs(lake, shard_partition_keys(), run_status)
    if not requests:
        return dg.SkipReason(reason)
    context.log.info(reason)
    return dg.SensorResult(run_requests=requests)
