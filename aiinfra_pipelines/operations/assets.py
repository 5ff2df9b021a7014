"""Operations assets (group ``operations``): fleet telemetry, drift monitor, compute-cost ledger.

Each publishes itself to ``main`` (run branch, commit, merge) because what it produces is a
record others act on: rollout reads the telemetry, the retraining sensor the drift verdict,
operators the ledger.
"""

import io
import json
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd

from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.datasets.selection import TRAINING_LATEST, read_json_if_exists
from aiinfra_pipelines.ingest.resources import AnonymizationKey
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.io_manager import parquet_bytes
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH, publish_objects, root_run_id_of
from aiinfra_pipelines.mining.engine_runner import run_engine_over_frames
from aiinfra_pipelines.perception.contract import decode_images, perception_spec
from aiinfra_pipelines.perception.deployed import load_deployed_engine
from aiinfra_pipelines.release.rollout import (
    PUBLISHED_TELEMETRY_PREFIX,
    TELEMETRY_COMMIT_KIND,
    publish_changes,
    telemetry_publishes,
)
from aiinfra_pipelines.release.shadow import recent_rows, shadow_agreement

from .cost_ledger import (
    BY_GROUP_KEY,
    STEPS_KEY,
    LedgerSettings,
    ledger_by_asset,
    ledger_by_group,
    loop_asset_groups,
    step_costs,
)
from .drift import (
    LATEST_DRIFT_KEY,
    DriftSettings,
    drift_record_key,
    drift_verdict,
    image_statistics,
)
from .failures import loop_failures
from .landing import read_uploads
from .outbox_telemetry import outbox_by_vehicle
from .telemetry import (
    TelemetrySettings,
    confidence_histogram,
    telemetry_summary,
    validate_uploads,
)

GROUP = "operations"
SOURCE_COMMIT_TAG = "aiinfra/source_commit"
DRIFT_CHECK = "drift_within_thresholds"
TELEMETRY_QUARANTINE_PREFIX = "telemetry/quarantine/"

telemetry_batches = dg.DynamicPartitionsDefinition(name="telemetry_batches")


def telemetry_records_key(batch: str) -> str:
    return f"{PUBLISHED_TELEMETRY_PREFIX}{batch}.parquet"


def telemetry_quarantine_key(batch: str) -> str:
    return f"{TELEMETRY_QUARANTINE_PREFIX}{batch}.parquet"


def _md(table: pd.DataFrame, limit: int | None = None) -> dg.MetadataValue:
    shown = table if limit is None else table.head(limit)
    return dg.MetadataValue.md(shown.to_markdown(index=False) if len(shown) else "none")


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
    uploads = read_uploads(lake, commit, settings)
    if not uploads:
        raise dg.Failure(
            description=(
                f"no telemetry uploads under {settings.upload_prefix} on {branch} at "
                f"{commit[:12]}: land telemetry first (operations.landing.land_telemetry)"
            ),
            allow_retries=False,
        )
    batch = validate_uploads(
        uploads, batch_id=branch, source_commit=commit, key=anonymization.key(), settings=settings
    )
    records_key = telemetry_records_key(branch)
    quarantine_key = telemetry_quarantine_key(branch)
    puts = {records_key: parquet_bytes(batch.accepted)}
    if not batch.quarantined.empty:
        puts[quarantine_key] = parquet_bytes(batch.quarantined)
    main_commit = publish_changes(
        lake,
        root_run_id_of(context.run),
        puts,
        [] if not batch.quarantined.empty else [quarantine_key],
        f"telemetry {branch}: {len(batch.accepted)} record(s), "
        f"{len(batch.quarantined)} quarantined",
        {
            "kind": TELEMETRY_COMMIT_KIND,
            "batch_id": branch,
            "records_key": records_key,
            "source_commit": commit,
            "accepted": str(len(batch.accepted)),
            "quarantined": str(len(batch.quarantined)),
            "dagster_run_id": context.run.run_id,
        },
    )
    quarantine_view = batch.quarantined[["source_key", "record_index", "reason_codes", "reasons"]]
    metadata = {
        "accepted": len(batch.accepted),
        "quarantined": len(batch.quarantined),
        "frames": int(batch.accepted["frames"].sum()) if len(batch.accepted) else 0,
        "reasons": dg.MetadataValue.json(batch.reason_counts),
        "quarantine": _md(quarantine_view, settings.quarantine_listed),
        "by_model_and_version": _md(telemetry_summary(batch.accepted)),
        # Cars that ran a candidate in shadow mode: how often it would have decided the same.
        "shadow_mode": dg.MetadataValue.json(shadow_agreement(batch.accepted)),
        # Each car's upload outbox: backlog, bytes per priority, evictions, pulls it served.
        "outbox_by_vehicle": _md(outbox_by_vehicle(batch.accepted)),
        "source_commit": commit,
        "main_commit": main_commit,
        "records": f"lakefs://{lake.repository}/{main_commit}/{records_key}",
    }
    if batch.accepted.empty:
        raise dg.Failure(
            description=(
                f"every telemetry record of {branch} was quarantined "
                f"({len(batch.quarantined)}): {batch.reason_counts}; see {quarantine_key} on main"
            ),
            metadata=metadata,
            allow_retries=False,
        )
    if not batch.quarantined.empty:
        context.log.warning(f"{len(batch.quarantined)} telemetry record(s) quarantined")
    return dg.MaterializeResult(metadata=metadata)


# ------------------------------------------------------------------------------------- drift
def _sample(rows: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    return rows if len(rows) <= n else rows.sample(n=n, random_state=seed)


def _frame_signals(lake: VersionedLake, rows: pd.DataFrame, ref: str, engine) -> pd.DataFrame:
    """Image statistics and the deployed engine's confidence for each row's frame."""
    if rows.empty:
        return pd.DataFrame()
    spec = perception_spec()
    frames = load_frames(lake, rows, ref)
    images = decode_images(list(frames["image"]), spec.image_height, spec.image_width)
    signals = image_statistics(images)
    signals["confidence"] = run_engine_over_frames(engine, frames, spec).confidence
    return signals


def _telemetry_confidence(
    lake: VersionedLake, engine_sha256: str, batches: int
) -> tuple[list[int], str | None]:
    """Merged confidence histogram of the newest telemetry from ``engine_sha256``."""
    publishes = telemetry_publishes(lake, limit=batches)
    totals: np.ndarray | None = None
    seen = set()
    for publish in publishes:
        if publish.records_key in seen or not lake.object_exists(
            publish.commit, publish.records_key
        ):
            continue
        seen.add(publish.records_key)
        table = pd.read_parquet(io.BytesIO(lake.get_object(publish.commit, publish.records_key)))
        table = table[table["engine_sha256"] == engine_sha256]
        for counts in table["confidence_histogram"]:
            counts = np.asarray(counts, dtype=np.int64)
            totals = counts if totals is None else totals + counts
    commit = publishes[0].commit if publishes else None
    return ([] if totals is None else [int(c) for c in totals]), commit


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
    settings = DriftSettings.load()
    telemetry = TelemetrySettings.load()
    deployed = load_deployed_engine(lake)
    pointer = read_json_if_exists(lake, TRAINING_LATEST)
    reference_rows = pd.DataFrame()
    if pointer is not None:
        rows = pd.read_parquet(io.BytesIO(lake.get_object(pointer["commit"], pointer["rows_key"])))
        reference_rows = _sample(rows, settings.reference_samples, settings.seed)
    recent = recent_rows(scene_index_view(lake), settings.max_logs, settings.max_age_days)
    recent_sample = _sample(recent, settings.recent_samples, settings.seed)
    reference = (
        _frame_signals(lake, reference_rows, pointer["commit"], deployed.engine)
        if pointer
        else pd.DataFrame()
    )
    current = _frame_signals(lake, recent_sample, MAIN_BRANCH, deployed.engine)
    histograms = {}
    telemetry_counts, telemetry_commit = _telemetry_confidence(
        lake, deployed.engine.sha256, settings.telemetry_batches
    )
    if telemetry_counts and not reference.empty:
        reference_counts = confidence_histogram(
            reference["confidence"].to_numpy(), telemetry.confidence_bins
        )
        histograms["telemetry_confidence"] = (reference_counts, telemetry_counts)
    identity = {
        "dataset_version": pointer["version"] if pointer else None,
        "dataset_commit": pointer["commit"] if pointer else None,
        "recent_logs": sorted(recent["log_id"].unique().tolist()) if len(recent) else [],
        "engine_sha256": deployed.engine.sha256,
        "telemetry_commit": telemetry_commit,
    }
    verdict = drift_verdict(reference, current, settings, identity=identity, histograms=histograms)
    verdict["engine_version"] = deployed.version
    data = (json.dumps(verdict, sort_keys=True, indent=2) + "\n").encode()
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {drift_record_key(verdict["id"]): data, LATEST_DRIFT_KEY: data},
        f"drift verdict {verdict['id']}: {'drifted' if verdict['drifted'] else 'stable'}",
        {"kind": "drift", "verdict_id": verdict["id"], "drifted": str(verdict["drifted"]).lower()},
    )
    table = pd.DataFrame(
        [{"signal": name, **values} for name, values in sorted(verdict["metrics"].items())]
    )
    return dg.MaterializeResult(
        metadata={
            "verdict_id": verdict["id"],
            "drifted": verdict["drifted"],
            "signals": dg.MetadataValue.json(verdict["signals"]),
            "reason": verdict["reason"],
            "metrics": _md(table),
            "reference": f"{identity['dataset_version']} ({len(reference)} frames)",
            "recent": f"{len(identity['recent_logs'])} logs ({len(current)} frames)",
            "main_commit": commit,
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=DRIFT_CHECK,
                passed=not verdict["drifted"],
                severity=dg.AssetCheckSeverity.WARN,
                metadata={
                    "signals": dg.MetadataValue.json(verdict["signals"]),
                    "reason": verdict["reason"],
                    "insufficient_data": verdict["insufficient"],
                },
            )
        ],
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
    costs = step_costs(context.instance, groups, settings, exclude_run_ids=[context.run.run_id])
    by_group = ledger_by_group(costs)
    by_asset = ledger_by_asset(costs)
    summary: dict[str, Any] = {
        "runs": int(costs["run_id"].nunique()) if len(costs) else 0,
        "by_group": by_group.to_dict(orient="records"),
    }
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {
            STEPS_KEY: parquet_bytes(costs),
            BY_GROUP_KEY: (json.dumps(summary, sort_keys=True, indent=2) + "\n").encode(),
        },
        f"compute cost ledger over {summary['runs']} run(s)",
        {"kind": "cost-ledger", "dagster_run_id": context.run.run_id},
    )
    return dg.MaterializeResult(
        metadata={
            "runs": summary["runs"],
            "cpu_seconds": round(float(costs.loc[costs["compute"] == "cpu", "seconds"].sum()), 3),
            "gpu_seconds": round(float(costs.loc[costs["compute"] == "gpu", "seconds"].sum()), 3),
            "by_group": dg.MetadataValue.table(
                records=[
                    dg.TableRecord(
                        {
                            "group": str(row["group"]),
                            "cpu_seconds": round(float(row["cpu_seconds"]), 3),
                            "gpu_seconds": round(float(row["gpu_seconds"]), 3),
                            "steps": int(row["steps"]),
                            "runs": int(row["runs"]),
                        }
                    )
                    for row in by_group.to_dict(orient="records")
                ],
                schema=dg.TableSchema(
                    columns=[
                        dg.TableColumn("group", "string"),
                        dg.TableColumn("cpu_seconds", "float"),
                        dg.TableColumn("gpu_seconds", "float"),
                        dg.TableColumn("steps", "int"),
                        dg.TableColumn("runs", "int"),
                    ]
                ),
            ),
            "by_asset_partition": _md(by_asset.round(3), 100),
            "main_commit": commit,
            "ledger": f"lakefs://{lake.repository}/{commit}/{STEPS_KEY}",
        }
    )
