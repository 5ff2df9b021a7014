"""Ingestion assets (group ``ingest``), one dynamic partition per landed upload batch.

drive_logs → {validated_drive_logs, anonymized_frames, scene_index} → published_ingest.
The middle step works the batch's logs on a pool of worker processes (``ingest_batch``); each
log gets its own verdict, and rejected logs are quarantined with every reason while the good
ones go on. Everything is written on the run's lake branch; ``published_ingest`` merges it into
``main`` in one merge, only after the blocking checks (no PII, Great Expectations suites) have
passed — so a failed audit, or a run killed anywhere, leaves ``main`` exactly as it was.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pandas as pd
from pydantic import Field

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.lake.audits import RequiredAudit, verify_audits
from aiinfra_pipelines.lake.io_manager import asset_object_base
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import (
    ensure_run_branch,
    publish_run_branch,
    root_run_id_of,
    run_branch_name,
)
from aiinfra_pipelines.parallel import PoolSettings

from .batch import (
    LogOutcome,
    batch_record_key,
    ingest_batch,
    stage_batch_records,
)
from .discovery import batch_log_keys
from .expectations import suite_names
from .metadata import scene_index_metadata, validated_logs_metadata
from .partitions import BatchRef, ingest_batch_partitions
from .resources import AnonymizationKey
from .verdicts import JUDGED, QUARANTINED

GROUP = "ingest"
RETRY = dg.RetryPolicy(
    max_retries=3, delay=1, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.FULL
)
# The lake object each blocking check audits: the asset's stored output for the partition.
AUDITED_FORMATS = {"anonymized_frames": ".json", "scene_index": ".parquet"}


def root_run_id(context: dg.AssetExecutionContext) -> str:
    """The run id whose lake branch this run (or retry of it) writes on."""
    return root_run_id_of(context.run)


def audited_object_key(asset: str, partition: str) -> str:
    """The lake object an ingest check audits: the asset's output for the partition."""
    return asset_object_base(dg.AssetKey(asset), partition) + AUDITED_FORMATS[asset]


def required_audits(partition: str) -> list[RequiredAudit]:
    """Every blocking check that must have passed before a batch may reach ``main``."""
    checks = [("anonymized_frames", "anonymized_frames_have_no_pii")]
    checks += [("scene_index", f"gx_{name}") for name in suite_names("scene_index")]
    return [RequiredAudit(a, c, audited_object_key(a, partition)) for a, c in checks]


class IngestBatchConfig(dg.Config):
    """Launchpad options of a batch run (the sensor's runs use the defaults)."""

    revalidate_quarantined: bool = Field(
        default=False,
        description="Judge the batch's quarantined logs again (after fixing a rule in "
        "resources/logs.yaml or an expectation suite); accepted logs are never re-ingested.",
    )


def _progress_logger(context: dg.AssetExecutionContext) -> Any:
    """Log about every tenth of the batch (each log line is an event-log write)."""

    def on_log(done: int, total: int, outcome: LogOutcome) -> None:
        step = max(1, total // 10)
        if done == total or done % step == 0:
            context.log.info(f"{done}/{total} logs worked (last: {outcome.location.key})")
        if outcome.verdict == QUARANTINED:
            codes = ",".join(code for code, _ in outcome.reasons)
            context.log.warning(f"quarantined {outcome.location.name}: {codes}")

    return on_log


@dg.asset(
    partitions_def=ingest_batch_partitions,
    group_name=GROUP,
    kinds={"mcap", "lakefs"},
    retry_policy=RETRY,
)
def drive_logs(context: dg.AssetExecutionContext, lake: VersionedLake) -> dict[str, Any]:
    """The raw drive logs of one upload batch, pinned to the commit that landed them.

    The bytes stay where they landed (raw logs carry PII and never reach ``main``); this asset
    records which objects at which commit the rest of the partition reads.
    """
    batch = BatchRef.from_partition_key(context.partition_key)
    keys = batch_log_keys(lake, batch)
    logs = []
    for key in keys:
        stat = lake.stat_object(batch.commit, key)
        logs.append({"key": key, "size": stat.size, "checksum": stat.checksum})
    context.add_output_metadata(
        {
            "source_branch": batch.branch,
            "source_commit": batch.commit,
            "logs": len(logs),
            "size_bytes": sum(log["size"] for log in logs),
        }
    )
    return {"branch": batch.branch, "commit": batch.commit, "logs": logs}


@dg.multi_asset(
    name="ingest_batch",
    partitions_def=ingest_batch_partitions,
    group_name=GROUP,
    outs={
        "validated_drive_logs": dg.AssetOut(
            kinds={"pandas", "mcap"},
            description="One verdict per log of the batch: accepted, quarantined (with every "
            "reason), duplicate (same SHA-256 ingested before) or already_ingested (a re-run).",
        ),
        "anonymized_frames": dg.AssetOut(
            kinds={"parquet"},
            description="Accepted logs' frames with PII removed (VIN → keyed HMAC pseudonym, "
            "GPS coarsened, plates blurred): one Parquet object per log, listed here.",
        ),
        "scene_index": dg.AssetOut(
            kinds={"pandas", "parquet"},
            description="One row per accepted frame: every log tag, signals and event flags; "
            "no pixels, no PII.",
        ),
    },
    retry_policy=RETRY,
)
def ingest_batch_logs(
    context: dg.AssetExecutionContext,
    config: IngestBatchConfig,
    lake: VersionedLake,
    anonymization: AnonymizationKey,
    drive_logs: dict[str, Any],
) -> Iterator[dg.Output]:
    """Every log of the batch validated, anonymized and indexed on the worker pool."""
    batch = BatchRef(drive_logs["branch"], drive_logs["commit"])
    run_branch = ensure_run_branch(lake, root_run_id(context))
    main_ref = lake.resolve_ref(MAIN_BRANCH)
    pool = PoolSettings.load("ingest.yaml")
    context.log.info(f"{len(drive_logs['logs'])} logs on {pool.workers} worker(s)")
    result = ingest_batch(
        lake,
        batch,
        [log["key"] for log in drive_logs["logs"]],
        run_branch=run_branch,
        main_ref=main_ref,
        anonymization_key=anonymization.key(),
        pool=pool,
        on_log=_progress_logger(context),
        revalidate_quarantined=config.revalidate_quarantined,
    )
    stage_batch_records(lake, result, run_branch, main_ref, context.run.run_id)
    rows = settings_section("ingest.yaml").int("metadata_rows")
    yield dg.Output(
        result.verdicts(),
        output_name="validated_drive_logs",
        metadata=validated_logs_metadata(result, rows, pool.workers),
    )
    manifest = result.frames_manifest()
    yield dg.Output(
        manifest,
        output_name="anonymized_frames",
        metadata={"logs": len(manifest["logs"]), "frames": manifest["frames"]},
    )
    index = result.scene_index()
    yield dg.Output(index, output_name="scene_index", metadata=scene_index_metadata(index))


@dg.asset(
    partitions_def=ingest_batch_partitions,
    group_name=GROUP,
    kinds={"lakefs"},
    deps=["anonymized_frames", "scene_index"],
    retry_policy=RETRY,
)
def published_ingest(
    context: dg.AssetExecutionContext, lake: VersionedLake, validated_drive_logs: pd.DataFrame
) -> dg.MaterializeResult:
    """Write–audit–publish: the batch's good logs, quarantine records and ledger in one merge.

    Blocking checks on ``anonymized_frames`` and ``scene_index`` stand before this step, and it
    verifies their audit records itself, so re-executing it alone cannot skip an audit. A batch
    that an earlier run already published is not merged again: a re-run changes nothing.
    """
    partition = context.partition_key
    batch = BatchRef.from_partition_key(partition)
    run_root = root_run_id(context)
    counts = validated_drive_logs["verdict"].value_counts().to_dict()
    summary = {f"logs_{verdict}": int(count) for verdict, count in counts.items()}
    branch = run_branch_name(run_root)
    retried_after_merge = not lake.branch_exists(branch)
    if not retried_after_merge:
        judged = validated_drive_logs["verdict"].isin(JUDGED).any()
        if lake.object_exists(MAIN_BRANCH, batch_record_key(batch)) and not judged:
            lake.delete_branch(branch)
            context.log.info(f"{partition} was published by an earlier run; main is unchanged")
            return dg.MaterializeResult(
                metadata={
                    "main_commit": lake.resolve_ref(MAIN_BRANCH),
                    "already_published": True,
                    **summary,
                }
            )
        verify_audits(lake, run_root, required_audits(partition), partition)
    # Without its branch, a retry after this run's merge went through: publish_run_branch
    # returns that merge (and raises if the run never published anything).
    merge_commit = publish_run_branch(
        lake,
        run_root,
        f"publish {partition}",
        {
            "kind": "ingest",
            "source_branch": batch.branch,
            "source_commit": batch.commit,
            "dagster_run_id": context.run.run_id,
            "partition": partition,
            **{k: str(v) for k, v in summary.items()},
        },
    )
    return dg.MaterializeResult(
        metadata={
            "main_commit": merge_commit,
            "source_commit": batch.commit,
            "lake_ref": f"lakefs://{lake.repository}/{merge_commit}",
            "already_published": retried_after_merge,
            **summary,
        }
    )
