"""Blocking audits that stand between ingestion's writes and the publish to ``main``."""

from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.lake.audits import record_audit
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import root_run_id_of
from aiinfra_pipelines.logs.anonymize import find_pii_leaks
from aiinfra_pipelines.logs.reader import read_drive_log

from .assets import anonymized_frames, audited_object_key, scene_index
from .expectations import run_suite, suite_names
from .partitions import drive_log_partitions


@dg.asset_check(
    asset=anonymized_frames,
    partitions_def=drive_log_partitions,
    blocking=True,
    additional_ins={"drive_logs": dg.AssetIn()},
    description="No raw VIN and no exact GPS coordinate of the raw log remains.",
)
def anonymized_frames_have_no_pii(
    context: dg.AssetCheckExecutionContext,
    lake: VersionedLake,
    anonymized_frames: pd.DataFrame,
    drive_logs: dict[str, Any],
) -> dg.AssetCheckResult:
    """Re-reads the raw log and searches the published table for any trace of its identifiers."""
    raw = read_drive_log(lake.get_object(drive_logs["commit"], drive_logs["key"]))
    raw_coordinates = {(frame.latitude, frame.longitude) for frame in raw.frames}
    leaks = find_pii_leaks(anonymized_frames, {raw.metadata["vin"]}, raw_coordinates)
    _record(context, lake, "anonymized_frames", "anonymized_frames_have_no_pii", not leaks)
    return dg.AssetCheckResult(
        passed=not leaks,
        # Where the leaks are, never their values: this metadata is shown to every operator.
        metadata={
            "leaks": len(leaks),
            "leak_locations": dg.MetadataValue.json(leaks[:10]),
            "frames_checked": len(anonymized_frames),
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
        asset=scene_index,
        name=f"gx_{suite_name}",
        partitions_def=drive_log_partitions,
        blocking=True,
        description=f"Great Expectations suite resources/expectations/{suite_name}.json",
    )
    def _check(
        context: dg.AssetCheckExecutionContext, lake: VersionedLake, scene_index: pd.DataFrame
    ) -> dg.AssetCheckResult:
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
