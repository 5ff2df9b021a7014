"""Blocking audits that stand between ingestion's writes and the publish to ``main``."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pyarrow.parquet as pq

from aiinfra_pipelines.lake.audits import record_audit
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import read_ref, root_run_id_of
from aiinfra_pipelines.logs.anonymize import find_pii_leaks
from aiinfra_pipelines.logs.lazy_frames import signal_frames
from aiinfra_pipelines.logs.reader import read_drive_log
from aiinfra_pipelines.parallel import PoolSettings, map_in_pool, worker_state

from .assets import audited_object_key
from .expectations import run_suite, suite_names
from .partitions import ingest_batch_partitions
from .streaming import StreamingSettings

LEAKS_LISTED = 10


@dataclass(frozen=True)
class PiiJob:
    """One accepted log to audit: its raw bytes' location and its published frames object."""

    raw_commit: str
    raw_key: str
    frames_ref: str
    frames_object: str
    checksum: str


def pii_leaks_of_log(job: PiiJob) -> list[str]:
    """Leaks of one log's raw identifiers into its frames table (runs in a worker)."""
    lake: VersionedLake = worker_state()["lake"]
    stored = lake.stat_object(job.frames_ref, job.frames_object).checksum
    if stored != job.checksum:  # audit what the manifest names, nothing else
        return [f"{job.frames_object} changed after ingestion (checksum {stored[:12]})"]
    settings = StreamingSettings.load()
    with settings.scratch() as scratch:  # both files streamed, neither read whole
        raw_path, frames_path = Path(scratch, "raw"), Path(scratch, "frames.parquet")
        lake.download_object(job.raw_commit, job.raw_key, raw_path)
        lake.download_object(job.frames_ref, job.frames_object, frames_path)
        raw = read_drive_log(raw_path, streaming=True)
        coordinates = {(f.latitude, f.longitude) for f in signal_frames(raw.frames)}
        leaks: dict[str, None] = {}  # in order found, each once across row groups
        frames = pq.ParquetFile(frames_path)
        for group in range(frames.num_row_groups):
            table = frames.read_row_group(group).to_pandas()
            leaks.update(dict.fromkeys(find_pii_leaks(table, {raw.metadata["vin"]}, coordinates)))
    return [f"{job.raw_key}: {leak}" for leak in leaks]


@dg.asset_check(
    asset="anonymized_frames",
    partitions_def=ingest_batch_partitions,
    blocking=True,
    additional_ins={"drive_logs": dg.AssetIn()},
    description="No raw VIN and no exact GPS coordinate of any raw log remains in its frames.",
)
def anonymized_frames_have_no_pii(
    context: dg.AssetCheckExecutionContext,
    lake: VersionedLake,
    anonymized_frames: dict[str, Any],
    drive_logs: dict[str, Any],
) -> dg.AssetCheckResult:
    """Re-reads every accepted raw log and searches its frames table for its identifiers."""
    ref = read_ref(lake, root_run_id_of(context.run))
    jobs = [
        PiiJob(drive_logs["commit"], log["log_key"], ref, log["frames_object"], log["checksum"])
        for log in anonymized_frames["logs"]
    ]
    leaks = [
        leak
        for found in map_in_pool(
            pii_leaks_of_log, jobs, {"lake": lake}, PoolSettings.load("ingest.yaml")
        )
        for leak in found
    ]
    _record(context, lake, "anonymized_frames", "anonymized_frames_have_no_pii", not leaks)
    return dg.AssetCheckResult(
        passed=not leaks,
        # Where the leaks are, never their values: this metadata is shown to every operator.
        metadata={
            "leaks": len(leaks),
            "leak_locations": dg.MetadataValue.json(leaks[:LEAKS_LISTED]),
            "logs_checked": len(jobs),
            "frames_checked": int(anonymized_frames["frames"]),
        },
    )


def _record(
    context: dg.AssetCheckExecutionContext,
    lake: VersionedLake,
    asset: str,
    check: str,
    passed: bool,
) -> None:
    """Keep the verdict beside the audited object so the publish step can verify it."""
    partition = context.partition_key
    record_audit(
        lake,
        root_run_id_of(context.run),
        asset=asset,
        check=check,
        partition=partition,
        audited_key=audited_object_key(asset, partition),
        passed=passed,
        dagster_run_id=context.run.run_id,
    )


def build_expectation_check(suite_name: str) -> dg.AssetChecksDefinition:
    """One blocking Dagster asset check per Great Expectations suite file."""

    @dg.asset_check(
        asset="scene_index",
        name=f"gx_{suite_name}",
        partitions_def=ingest_batch_partitions,
        blocking=True,
        description=f"Great Expectations suite resources/expectations/{suite_name}.json",
    )
    def _check(
        context: dg.AssetCheckExecutionContext, lake: VersionedLake, scene_index: pd.DataFrame
    ) -> dg.AssetCheckResult:
        if scene_index.empty:
            # A batch whose every log was quarantined or a duplicate indexes no frame: there
            # is no row for a suite to judge, and nothing of the index reaches main.
            _record(context, lake, "scene_index", f"gx_{suite_name}", True)
            return dg.AssetCheckResult(
                passed=True, metadata={"evaluated": 0, "note": "no accepted frames in the batch"}
            )
        outcomes = run_suite(scene_index, suite_name)
        failed = [o for o in outcomes if not o.success]
        _record(context, lake, "scene_index", f"gx_{suite_name}", not failed)
        table = dg.MetadataValue.md(
            "\n".join(
                [
                    "| expectation | column | ok | unexpected | detail |",
                    "| --- | --- | --- | --- | --- |",
                ]
                + [
                    f"| {o.expectation} | {o.column} | {'✅' if o.success else '❌'} | "
                    f"{o.unexpected_count if o.unexpected_count is not None else ''} | "
                    f"{o.detail.replace('|', '/')} |"
                    for o in outcomes
                ]
            )
        )
        return dg.AssetCheckResult(
            passed=not failed,
            metadata={"evaluated": len(outcomes), "failed": len(failed), "results": table},
        )

    return _check


def ingest_checks() -> list[dg.AssetChecksDefinition]:
    return [
        anonymized_frames_have_no_pii,
        *(build_expectation_check(name) for name in suite_names("scene_index")),
    ]
