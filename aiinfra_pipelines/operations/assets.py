"""Operations assets (group ``operations``): fleet telemetry, drift monitor, compute-cost ledger.

Each publishes itself to ``main`` (run branch, commit, merge) because what it produces is a
record others act on: rollout reads the telemetry, the retraining sensor the drift verdict,
operators the ledger.
"""

import dagster as dg

from aiinfra_pipelines.ingest.resources import AnonymizationKey
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.io_manager import parquet_bytes
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects, root_run_id_of
from aiinfra_pipelines.runs import SOURCE_COMMIT_TAG

from .cost_ledger import BY_GROUP_KEY, STEPS_KEY, LedgerSettings, build_ledger, loop_asset_groups
from .drift import LATEST_DRIFT_KEY, drift_record_key
from .drift_run import measure_drift
from .failures import loop_failures
from .metadata import drift_check_result, drift_metadata, ledger_metadata, telemetry_metadata
from .telemetry import TelemetrySettings
from .telemetry_batch import (
    TELEMETRY_QUARANTINE_PREFIX,
    fail_if_all_quarantined,
    publish_batch,
    telemetry_quarantine_key,
    telemetry_records_key,
    validate_batch,
)

__all__ = ["TELEMETRY_QUARANTINE_PREFIX", "telemetry_quarantine_key", "telemetry_records_key"]

GROUP = "operations"
DRIFT_CHECK = "drift_within_thresholds"

telemetry_batches = dg.DynamicPartitionsDefinition(name="telemetry_batches")


@dg.asset(
    partitions_def=telemetry_batches,
    group_name=GROUP,
    kinds={"lakefs", "pandas"},
    description="Vehicle-side telemetry of one ingest batch, validated and published to main.",
)
def fleet_telemetry(
    context: dg.AssetExecutionContext, lake: VersionedLake, anonymization: AnonymizationKey
) -> dg.MaterializeResult:
    """Telemetry records of one batch (partition = its ``ingest-<batch>`` branch).

    Every upload file at the landed commit is parsed and every record checked; bad records go
    to ``telemetry/quarantine/<batch>.parquet`` with every reason, the rest (VIN → keyed
    pseudonym) to ``telemetry/records/<batch>.parquet``, both in one publish commit whose
    metadata rollout uses to find fresh telemetry. A batch where nothing is valid publishes its
    quarantine and then fails, naming the reasons, so an operator sees it.
    """
    settings = TelemetrySettings.load()
    branch = context.partition_key
    commit = context.run.tags.get(SOURCE_COMMIT_TAG) or lake.resolve_ref(branch)
    batch = validate_batch(lake, branch, commit, anonymization.key(), settings)
    root = root_run_id_of(context.run)
    main_commit = publish_batch(lake, root, context.run.run_id, branch, commit, batch)
    records = f"lakefs://{lake.repository}/{main_commit}/{telemetry_records_key(branch)}"
    metadata = telemetry_metadata(batch, settings.quarantine_listed, commit, main_commit, records)
    fail_if_all_quarantined(branch, batch, metadata)
    if not batch.quarantined.empty:
        context.log.warning(f"{len(batch.quarantined)} telemetry record(s) quarantined")
    return dg.MaterializeResult(metadata=metadata)


# ------------------------------------------------------------------------------------- drift
@dg.asset(
    group_name=GROUP,
    kinds={"onnx", "lakefs"},
    deps=["training_dataset", "published_ingest", fleet_telemetry],
    check_specs=[dg.AssetCheckSpec(DRIFT_CHECK, asset="drift_monitor")],
)
def drift_monitor(context: dg.AssetExecutionContext, lake: VersionedLake) -> dg.MaterializeResult:
    """Input (image statistics) and confidence drift of recent fleet frames vs training data.

    The verdict is published to ``operations/drift/`` (``latest.json`` is what the retraining
    sensor reads); the check fails when any signal drifted, so it shows in the UI.
    """
    measured = measure_drift(lake)
    verdict = measured.verdict
    data = measured.to_json_bytes()
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {drift_record_key(verdict["id"]): data, LATEST_DRIFT_KEY: data},
        f"drift verdict {verdict['id']}: {'drifted' if verdict['drifted'] else 'stable'}",
        {"kind": "drift", "verdict_id": verdict["id"], "drifted": str(verdict["drifted"]).lower()},
    )
    metadata = drift_metadata(
        verdict, measured.identity, measured.reference_frames, measured.current_frames, commit
    )
    return dg.MaterializeResult(
        metadata=metadata, check_results=[drift_check_result(DRIFT_CHECK, verdict)]
    )


# ---------------------------------------------------------------------------- cost ledger
@dg.asset(group_name=GROUP, kinds={"dagster", "lakefs"})
def compute_cost_ledger(
    context: dg.AssetExecutionContext, lake: VersionedLake
) -> dg.MaterializeResult:
    """CPU/GPU seconds per asset, partition and group, from the instance's run records."""
    settings = LedgerSettings.load()
    groups = loop_asset_groups(
        [
            dg.Definitions(
                assets=[fleet_telemetry, drift_monitor, compute_cost_ledger, loop_failures]
            )
        ]
    )
    ledger = build_ledger(context.instance, groups, settings, [context.run.run_id])
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {STEPS_KEY: parquet_bytes(ledger.costs), BY_GROUP_KEY: json_document(ledger.summary())},
        f"compute cost ledger over {ledger.runs} run(s)",
        {"kind": "cost-ledger", "dagster_run_id": context.run.run_id},
    )
    ledger_ref = f"lakefs://{lake.repository}/{commit}/{STEPS_KEY}"
    return dg.MaterializeResult(
        metadata=ledger_metadata(
            ledger.costs, ledger.by_group, ledger.by_asset, ledger.runs, commit, ledger_ref
        )
    )
